#define BOOST_TEST_MODULE strings
#include <boost/test/unit_test.hpp>

#include <string_view>
#include <vector>

#include "base/strings.hpp"

using namespace strata;
using Items = std::vector<std::string_view>;

BOOST_AUTO_TEST_CASE(split_keeps_empty_items) {
  BOOST_TEST(strings::split("a,,b") == (Items{"a", "", "b"}), boost::test_tools::per_element());
  BOOST_TEST(strings::split("") == Items{""}, boost::test_tools::per_element());
  BOOST_TEST(strings::split(",") == (Items{"", ""}), boost::test_tools::per_element());
  BOOST_TEST(strings::split("x") == Items{"x"}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(split_other_separator_and_offsets) {
  std::string_view text = "/a:/b c:";
  auto items = strings::split(text, ':');
  BOOST_TEST(items == (Items{"/a", "/b c", ""}), boost::test_tools::per_element());
  BOOST_TEST(items[1].data() - text.data() == 3);
}

BOOST_AUTO_TEST_CASE(trim_spaces_and_tabs_only) {
  BOOST_TEST(strings::trim(" \ta b\t ") == "a b");
  BOOST_TEST(strings::trim("   ") == "");
  BOOST_TEST(strings::trim("\nx\n") == "\nx\n");
}
