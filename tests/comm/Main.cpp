// Catch2's main for the communicator tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
