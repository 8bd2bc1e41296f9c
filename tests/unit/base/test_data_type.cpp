// The DataType and ReduceOp helpers of <strata/communicator.hpp>: isKnown for every enumerator
// and for values outside the enum, names and their parsing, element sizes.
#define BOOST_TEST_MODULE data_type
#include <boost/test/unit_test.hpp>

#include <iterator>
#include <string>

#include <strata/communicator.hpp>

using strata::DataType;
using strata::ReduceOp;

namespace {

const DataType kTypes[] = {
    DataType::Int8,   DataType::Uint8,   DataType::Int32,    DataType::Uint32,  DataType::Int64,
    DataType::Uint64, DataType::Float16, DataType::BFloat16, DataType::Float32, DataType::Float64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                         ReduceOp::Avg};

}  // namespace

BOOST_AUTO_TEST_CASE(every_enumerator_is_known) {
  for (DataType t : kTypes) {
    BOOST_TEST(strata::isKnown(t), "type " << static_cast<int>(t));
    BOOST_TEST(strata::sizeOf(t) > 0u);
    BOOST_TEST(strata::toString(t) != "unknown");
  }
  for (ReduceOp op : kOps) {
    BOOST_TEST(strata::isKnown(op), "op " << static_cast<int>(op));
    BOOST_TEST(strata::toString(op) != "unknown");
  }
}

BOOST_AUTO_TEST_CASE(values_outside_the_enum_are_unknown) {
  // Just past the last enumerator, negative, and far out: what a cast from an integer or a C
  // caller may pass.
  for (int v : {static_cast<int>(std::size(kTypes)), -1, 99, 1 << 20}) {
    auto t = static_cast<DataType>(v);
    BOOST_TEST(!strata::isKnown(t), "type " << v);
    BOOST_TEST(strata::sizeOf(t) == 0u);
    BOOST_TEST(strata::toString(t) == "unknown");
  }
  for (int v : {static_cast<int>(std::size(kOps)), -1, 99, 1 << 20}) {
    auto op = static_cast<ReduceOp>(v);
    BOOST_TEST(!strata::isKnown(op), "op " << v);
    BOOST_TEST(strata::toString(op) == "unknown");
  }
}

BOOST_AUTO_TEST_CASE(names_round_trip) {
  for (DataType t : kTypes) {
    auto parsed = strata::parseDataType(strata::toString(t));
    BOOST_TEST_REQUIRE(parsed.has_value(), std::string(strata::toString(t)));
    BOOST_TEST(static_cast<int>(*parsed) == static_cast<int>(t));
  }
  for (ReduceOp op : kOps) {
    auto parsed = strata::parseReduceOp(strata::toString(op));
    BOOST_TEST_REQUIRE(parsed.has_value(), std::string(strata::toString(op)));
    BOOST_TEST(static_cast<int>(*parsed) == static_cast<int>(op));
  }
  BOOST_TEST(static_cast<int>(*strata::parseDataType("bf16")) ==
             static_cast<int>(DataType::BFloat16));
  BOOST_TEST(static_cast<int>(*strata::parseDataType("char")) == static_cast<int>(DataType::Int8));
  BOOST_TEST(!strata::parseDataType("float128").has_value());
  BOOST_TEST(!strata::parseDataType("").has_value());
  BOOST_TEST(!strata::parseReduceOp("unknown").has_value());
  BOOST_TEST(!strata::parseReduceOp("Sum").has_value());
}

BOOST_AUTO_TEST_CASE(sizes) {
  BOOST_TEST(strata::sizeOf(DataType::Int8) == 1u);
  BOOST_TEST(strata::sizeOf(DataType::Float16) == 2u);
  BOOST_TEST(strata::sizeOf(DataType::BFloat16) == 2u);
  BOOST_TEST(strata::sizeOf(DataType::Uint32) == 4u);
  BOOST_TEST(strata::sizeOf(DataType::Float64) == 8u);
}
