// DECTRIS Stream V2: what a detector's PUSH socket sends, one CBOR map per ZeroMQ message —
// `start` (series metadata), `image` (one per image: channels of compressed pixels), `end`.
// numastream carries each message as it came; it reads only what routes it: the message type,
// the series it belongs to and the image number. Decoded with libcbor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace numastream::stream2 {

enum class Type { start, image, end };

struct Message {
  Type type = Type::image;
  std::uint64_t series_id = 0;
  std::string series_unique_id;
  std::uint64_t image_id = 0;  // image messages
  // Start messages: the images the series will have (ids 0 .. number_of_images - 1), when the
  // detector says.
  std::optional<std::uint64_t> number_of_images;
  // An end message numastream's sender made for a series its detector left unfinished
  // (build_end with a reason): why the series is incomplete. Empty otherwise.
  std::string incomplete;
};

// The routing fields of one message, or nullopt with `error` saying what is wrong (not CBOR,
// trailing bytes, not a map, no or unknown `type`, a missing or mistyped field).
std::optional<Message> parse(std::span<const std::byte> bytes, std::string& error);

const char* type_name(Type t) noexcept;

// How a typed array's bytes are stored: as they are, or compressed as the detector compressed
// them (CBOR tag 56500), in the framing of the HDF5 filter of the same name (bslz4: 32008,
// lz4: 32004).
enum class Compression { none, bslz4, lz4 };
const char* compression_name(Compression c) noexcept;

// An RFC 8746 typed array (tags 64, 68-72, 77-79, 85, 86: little-endian), alone or as the data of a
// row-major multi-dimensional array (tag 40): the pixels of one channel, a pixel mask, a flatfield.
struct Array {
  std::vector<std::uint64_t> dims;  // {rows, cols} (tag 40), or {elements} (a plain typed array)
  std::string dtype;                // codec/dtype.hpp names
  Compression compression = Compression::none;
  std::uint64_t elem_size = 0;       // as tag 56500 states it (compressed arrays)
  std::span<const std::byte> bytes;  // as in the message
};

// One field of a message that a file can store.
struct Value {
  enum class Kind { unsigned_integer, integer, real, boolean, text, reals, texts, array };
  Kind kind = Kind::unsigned_integer;
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string_view s;
  std::vector<double> reals;            // an array of numbers
  std::vector<std::string_view> texts;  // an array of text strings
  Array array;
};

// Walks a message's fields, calling `field(path, value)` for each one (the spans and views are
// valid during the call). Nested maps give '/'-joined paths: "data/threshold_1" (an image's
// channel), "pixel_mask/threshold_1", "goniometer/omega/start". Fields a file cannot hold as
// they are (an array mixing types, a map keyed by something other than text, nesting deeper than 8)
// are named in `skipped`. Returns false with `error` when the message is not Stream V2 CBOR or a
// typed array is malformed (a size that is not a whole number of elements, a product of
// dimensions that does not match, an unknown compression).
bool walk(std::span<const std::byte> message,
          const std::function<void(const std::string& path, const Value& value)>& field,
          std::vector<std::string>& skipped, std::string& error);

// An image's times as a detector sends them: series_date (RFC 3339), start_time, stop_time and
// real_time as rationals of the time base `ticks_per_second` (start and stop from series_date).
struct ImageTimes {
  std::string series_date;
  std::uint64_t start = 0, stop = 0, real = 0, ticks_per_second = 10000000;
};
// An image message of our own (the detector simulator's): each channel's pixels, already
// compressed (`compression` bslz4 or lz4 in the HDF5 filters' framing), as a tag 40 array of
// `dims`, typed `dtype`; with `times`, its series_date, start_time, stop_time and real_time.
struct ChannelPixels {
  std::string name;
  std::span<const std::byte> bytes;
};
std::vector<std::byte> build_image(std::uint64_t series_id, const std::string& series_unique_id,
                                   std::uint64_t image_id, const std::vector<std::uint64_t>& dims,
                                   const std::string& dtype, Compression compression,
                                   const std::vector<ChannelPixels>& channels,
                                   const struct ImageTimes* times = nullptr);
// The end message of a series. With `incomplete` (why), the end numastream's sender sends for a
// series whose detector went away before its end: a Stream V2 end message (a consumer closes the
// series instead of waiting for ever) with one more field, "numastream": {"incomplete": true,
// "reason": ...}, which Stream V2 consumers ignore and numastream's sinks report.
std::vector<std::byte> build_end(std::uint64_t series_id, const std::string& series_unique_id,
                                 const std::string& incomplete = "");

// A start message of our own (the detector simulator's, the tests'): type, series_id,
// series_unique_id, and the image count the series will have.
std::vector<std::byte> build_start(std::uint64_t series_id, const std::string& series_unique_id,
                                   std::uint64_t number_of_images);
// A start message as a detector sends one: also the arm date, image size, pixel type, channels,
// the sensor (Si, 450 um), pixel size (75 um), detector translation (0.12 m along the beam) and a
// few more geometry fields, the corrections (none enabled), the serial number, user data (empty),
// each channel's threshold energy (6 keV, 8 keV, ...), the saturation value (the dtype's largest
// value but one: the largest is "no data") and, per channel, a pixel mask (uint32, all zero but
// pixel (0, 0) = 1) — what the simulator's series and the tests' files carry; with `goniometer`,
// its axes' start and increment (degrees), as a detector armed for a rotation series sends them.
struct StartInfo {
  std::uint64_t series_id = 1;
  std::string series_unique_id;
  std::uint64_t number_of_images = 0;
  std::vector<std::uint64_t> dims;  // rows, cols
  std::string dtype = "uint16";
  std::vector<std::string> channels;
  double count_time = 0.001, beam_center_x = 0, beam_center_y = 0, incident_wavelength = 1.0;
  std::string arm_date = "2026-01-01T00:00:00Z";  // RFC 3339, as a tag 0 date/time
  bool pixel_mask = true;
  struct Axis {
    std::string name;
    double start = 0, increment = 0;
  };
  std::vector<Axis> goniometer;
};
std::vector<std::byte> build_start(const StartInfo& info);

// The start message for a recorded series that lacks one: the series id and unique id of the
// first message that names them, the number of its image messages; with the first image's
// channels, shape, pixel type and series_date (as arm_date), the fields of build_start(StartInfo)
// without a pixel mask, and with `goniometer`'s axes.
std::vector<std::byte> start_for(std::span<const std::vector<std::byte>> series,
                                 const std::vector<StartInfo::Axis>& goniometer = {});

}  // namespace numastream::stream2
