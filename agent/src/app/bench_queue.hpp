// `bench queue`: what a hand-off through a stage queue costs when the consumer parks at once and
// when it spins first (data/spin.hpp), with producer and consumer on CPUs of their own and on one
// shared CPU: items per second and both threads' CPU time per item, medians of alternated rounds.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>

namespace numastream {

nlohmann::json queue_report(int rounds, int items, std::size_t item_bytes, bool print);

}  // namespace numastream
