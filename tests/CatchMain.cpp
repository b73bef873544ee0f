// Catch2's main, compiled once for every Catch2 test program (epl_catch_main).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
