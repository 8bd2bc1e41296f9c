#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/strings.hpp is internal to strata: applications include <strata/...> only"
#endif

// The one splitter for separated lists (configuration values, Slurm and PMIx lists, module
// search paths), so that every list in strata treats empty items and blanks alike.

#include <string_view>
#include <vector>

#include <strata/export.hpp>

namespace strata::strings {

/// Every item between separators, as views into `text`: "a,,b" -> {"a", "", "b"}, "" -> {""}.
/// Callers decide what an empty item means (skip it, or reject it with the item's offset,
/// item.data() - text.data()).
STRATA_API std::vector<std::string_view> split(std::string_view text, char sep = ',');

/// `text` without leading and trailing spaces and tabs.
STRATA_API std::string_view trim(std::string_view text);

}  // namespace strata::strings
