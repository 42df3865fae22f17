// The one Boost.Test main of every rlserve test executable.
#define BOOST_TEST_MODULE rlserve
#include <boost/test/unit_test.hpp>
