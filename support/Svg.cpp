// The SVG writer (see Svg.h).
#include "support/Svg.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace epl {

namespace {

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// A round step for about `ticks` ticks over `span`: 1, 2 or 5 times a power of ten.
double tickStep(double span, int ticks) {
  double raw = span / ticks, power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

} // namespace

void Svg::rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& title) {
  body_ << fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                       "fill=\"{}\" stroke=\"#ffffff\" stroke-width=\"0.5\"><title>{}</title>"
                       "</rect>\n",
                       x, y, std::max(w, 0.0), h, fill, escaped(title));
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke,
               double width) {
  body_ << fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                       "stroke=\"{}\" stroke-width=\"{}\"/>\n",
                       x1, y1, x2, y2, stroke, width);
}

void Svg::polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                   bool dots) {
  std::string list;
  for (const auto& [x, y] : points)
    list += fmt::format("{:.1f},{:.1f} ", x, y);
  body_ << fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" "
                       "stroke-width=\"1.5\"/>\n",
                       list, stroke);
  if (dots)
    for (const auto& [x, y] : points)
      body_ << fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x, y,
                           stroke);
}

void Svg::text(double x, double y, const std::string& s, int size, const char* anchor) {
  body_ << fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{}\" "
                       "text-anchor=\"{}\">{}</text>\n",
                       x, y, size, anchor, escaped(s));
}

std::string Svg::str() const {
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" "
                     "height=\"{:.0f}\" font-family=\"sans-serif\">\n"
                     "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n{}</svg>\n",
                     width_, height_, body_.str());
}

std::string lineChart(const std::string& title, const std::string& xLabel,
                      const std::vector<ChartSeries>& series) {
  const double left = 60, top = 40, width = 720, height = 360;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool any = false;
  for (const ChartSeries& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if (!any) x0 = x1 = x, y0 = y1 = y;
      any = true;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  auto px = [&](double x) { return left + width * (x - x0) / (x1 - x0); };
  auto py = [&](double y) { return top + height * (1 - (y - y0) / (y1 - y0)); };
  Svg svg(left + width + 170, top + height + 50);
  svg.text(10, 22, title, 13);
  svg.line(left, top + height, left + width, top + height, "#333333");
  svg.line(left, top, left, top + height, "#333333");
  double dy = tickStep(y1 - y0, 6);
  for (double y = std::ceil(y0 / dy) * dy; y <= y1 + dy * 1e-9; y += dy) {
    svg.line(left, py(y), left + width, py(y), "#e5e5e5");
    svg.text(left - 6, py(y) + 4, fmt::format("{:g}", y), 10, "end");
  }
  double dx = tickStep(x1 - x0, 8);
  for (double x = std::ceil(x0 / dx) * dx; x <= x1 + dx * 1e-9; x += dx)
    svg.text(px(x), top + height + 16, fmt::format("{:g}", x), 10, "middle");
  svg.text(left + width / 2, top + height + 36, xLabel, 11, "middle");
  double legend = top;
  for (const ChartSeries& s : series) {
    std::vector<std::pair<double, double>> points;
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) points.push_back({px(x), py(y)});
    if (points.empty()) continue;
    svg.polyline(points, s.colour, s.dots);
    svg.line(left + width + 15, legend, left + width + 35, legend, s.colour, 2);
    svg.text(left + width + 40, legend + 4, s.name, 11);
    legend += 18;
  }
  return svg.str();
}

} // namespace epl
