// The DataType and ReduceOp helpers of <strata/communicator.hpp>: isKnown for every enumerator
// and for values outside the enum, names and their parsing, element sizes.
#define BOOST_TEST_MODULE data_type
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

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

// scaleElements and elementAsDouble (the NCCL API's pre-multiplication, docs/nccl-api.md): the
// factor converted to the type first, then one product per element, in place too; half and
// bfloat16 through fp32 with round to nearest even.
BOOST_AUTO_TEST_CASE(scale_elements_in_the_type) {
  std::vector<int32_t> i{1, -3, 7};
  std::vector<int32_t> io(3);
  strata::scaleElements(io.data(), i.data(), i.size(), DataType::Int32, 2.9);  // factor 2
  BOOST_TEST(io == (std::vector<int32_t>{2, -6, 14}), boost::test_tools::per_element());
  std::vector<double> d{0.5, 1.5};
  strata::scaleElements(d.data(), d.data(), d.size(), DataType::Float64, 0.25);
  BOOST_TEST(d[0] == 0.125);
  BOOST_TEST(d[1] == 0.375);
  // binary16: 1.0 = 0x3c00, 3.0 = 0x4200; x 0.5 gives 0.5 = 0x3800 and 1.5 = 0x3e00.
  std::vector<uint16_t> h{0x3c00, 0x4200}, ho(2);
  strata::scaleElements(ho.data(), h.data(), h.size(), DataType::Float16, 0.5);
  BOOST_TEST(ho[0] == 0x3800);
  BOOST_TEST(ho[1] == 0x3e00);
  // 2049 is not a binary16 value: 1 x 2049 rounds (to even) to 2048 = 0x6800.
  strata::scaleElements(ho.data(), h.data(), 1, DataType::Float16, 2049.0);
  BOOST_TEST(ho[0] == 0x6800);
  // bfloat16: 1.0 = 0x3f80; x 3 = 0x4040.
  std::vector<uint16_t> b{0x3f80}, bo(1);
  strata::scaleElements(bo.data(), b.data(), 1, DataType::BFloat16, 3.0);
  BOOST_TEST(bo[0] == 0x4040);
  const uint16_t half3 = 0x4200;
  BOOST_TEST(strata::elementAsDouble(&half3, DataType::Float16) == 3.0);
  const int8_t m = -5;
  BOOST_TEST(strata::elementAsDouble(&m, DataType::Int8) == -5.0);
  const uint64_t big = 1ull << 40;
  BOOST_TEST(strata::elementAsDouble(&big, DataType::Uint64) == 1099511627776.0);
  BOOST_CHECK_THROW(strata::scaleElements(ho.data(), h.data(), 1, static_cast<DataType>(99), 1.0),
                    strata::Error);
  BOOST_CHECK_THROW(strata::elementAsDouble(&m, static_cast<DataType>(99)), strata::Error);
}
