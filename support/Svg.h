// A small SVG writer for EPL's pictures (the plan's, the loss curves): rectangles with a
// tooltip, lines, text, on a white page.
#pragma once
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace epl {

class Svg {
public:
  Svg(double width, double height) : width_(width), height_(height) {}
  // A filled box; `title` is its tooltip in a browser.
  void rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& title);
  void line(double x1, double y1, double x2, double y2, const std::string& stroke,
            double width = 1);
  // A line through `points`, and a dot at each when `dots`.
  void polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                bool dots = false);
  void text(double x, double y, const std::string& s, int size = 12, const char* anchor = "start");
  std::string str() const;

private:
  double width_, height_;
  std::ostringstream body_;
};

// A line chart of one or more series of (x, y) points on shared axes, with a legend:
// each series a name, a colour and whether its points are drawn as dots.
struct ChartSeries {
  std::string name, colour;
  std::vector<std::pair<double, double>> points;
  bool dots = false;
};
std::string lineChart(const std::string& title, const std::string& xLabel,
                      const std::vector<ChartSeries>& series);

} // namespace epl
