// Building Stream V2 messages (start, image, end) as a DECTRIS detector sends them.
#include <cbor.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>

#include "detector/stream2.hpp"
#include "detector/stream2_cbor.hpp"

namespace numastream::stream2 {
using namespace detail;

namespace {

Item owned(cbor_item_t* item) {
  if (!item) throw std::bad_alloc();
  return Item(item);
}

void put(cbor_item_t* map, const std::string& key, Item value) {
  Item k = owned(cbor_build_string(key.c_str()));
  if (!cbor_map_add(map, cbor_pair{k.get(), value.get()})) throw std::bad_alloc();
}

void push(cbor_item_t* array, Item value) {
  if (!cbor_array_push(array, value.get())) throw std::bad_alloc();
}

Item tagged(std::uint64_t tag, Item inner) {
  Item t = owned(cbor_new_tag(tag));
  cbor_tag_set_item(t.get(), inner.get());
  return t;
}

Item bytes_item(std::span<const std::byte> b) {
  return owned(cbor_build_bytestring(reinterpret_cast<cbor_data>(b.data()), b.size()));
}

Item dims_item(const std::vector<std::uint64_t>& dims) {
  Item a = owned(cbor_new_definite_array(dims.size()));
  for (auto d : dims) push(a.get(), owned(cbor_build_uint64(d)));
  return a;
}

// tag 40 [dims, typed array(content)]
Item multidim(const std::vector<std::uint64_t>& dims, const std::string& dtype, Item content) {
  const TypedTag* t = typed_tag(dtype);
  if (!t) throw std::invalid_argument("stream2: no typed array tag for dtype \"" + dtype + "\"");
  Item pair = owned(cbor_new_definite_array(2));
  push(pair.get(), dims_item(dims));
  push(pair.get(), tagged(t->tag, std::move(content)));
  return tagged(kMultiDim, std::move(pair));
}

// The map inside the self-describe tag, as a detector marks its messages.
std::vector<std::byte> serialize(Item map) {
  Item root = tagged(kSelfDescribe, std::move(map));
  unsigned char* buf = nullptr;
  std::size_t cap = 0;
  const std::size_t n = cbor_serialize_alloc(root.get(), &buf, &cap);
  if (n == 0) {
    std::free(buf);
    throw std::bad_alloc();
  }
  std::vector<std::byte> out(reinterpret_cast<std::byte*>(buf),
                             reinterpret_cast<std::byte*>(buf) + n);
  std::free(buf);
  return out;
}

Item header(const char* type, std::uint64_t series_id, const std::string& unique,
            std::size_t fields) {
  Item map = owned(cbor_new_definite_map(fields + 3));
  put(map.get(), "type", owned(cbor_build_string(type)));
  put(map.get(), "series_id", owned(cbor_build_uint64(series_id)));
  put(map.get(), "series_unique_id", owned(cbor_build_string(unique.c_str())));
  return map;
}

}  // namespace

const char* compression_name(Compression c) noexcept {
  switch (c) {
    case Compression::none:
      return "none";
    case Compression::bslz4:
      return "bslz4";
    case Compression::lz4:
      return "lz4";
  }
  return "?";
}

std::vector<std::byte> build_start(std::uint64_t series_id, const std::string& series_unique_id,
                                   std::uint64_t number_of_images) {
  Item map = header("start", series_id, series_unique_id, 1);
  put(map.get(), "number_of_images", owned(cbor_build_uint64(number_of_images)));
  return serialize(std::move(map));
}

std::vector<std::byte> build_start(const StartInfo& info) {
  Item map = header("start", info.series_id, info.series_unique_id, 28);
  put(map.get(), "arm_date", tagged(kDateTime, owned(cbor_build_string(info.arm_date.c_str()))));
  put(map.get(), "detector_description",
      owned(cbor_build_string("numastream detector-sim (EIGER2-like)")));
  put(map.get(), "sensor_material", owned(cbor_build_string("Si")));
  put(map.get(), "sensor_thickness", owned(cbor_build_float8(450e-6)));
  put(map.get(), "pixel_size_x", owned(cbor_build_float8(75e-6)));
  put(map.get(), "pixel_size_y", owned(cbor_build_float8(75e-6)));
  Item translation = owned(cbor_new_definite_array(3));
  for (const double t : {0.0, 0.0, 0.12}) push(translation.get(), owned(cbor_build_float8(t)));
  put(map.get(), "detector_translation", std::move(translation));
  put(map.get(), "incident_energy",
      owned(cbor_build_float8(12398.4198 / info.incident_wavelength)));
  put(map.get(), "number_of_images", owned(cbor_build_uint64(info.number_of_images)));
  put(map.get(), "image_size_y", owned(cbor_build_uint64(info.dims.at(0))));
  put(map.get(), "image_size_x", owned(cbor_build_uint64(info.dims.at(1))));
  put(map.get(), "image_dtype", owned(cbor_build_string(info.dtype.c_str())));
  put(map.get(), "count_time", owned(cbor_build_float8(info.count_time)));
  put(map.get(), "frame_time", owned(cbor_build_float8(info.count_time)));
  put(map.get(), "beam_center_x", owned(cbor_build_float8(info.beam_center_x)));
  put(map.get(), "beam_center_y", owned(cbor_build_float8(info.beam_center_y)));
  put(map.get(), "incident_wavelength", owned(cbor_build_float8(info.incident_wavelength)));
  put(map.get(), "pixel_mask_enabled", owned(cbor_build_bool(true)));
  put(map.get(), "detector_serial_number", owned(cbor_build_string("numastream-sim-0")));
  put(map.get(), "countrate_correction_enabled", owned(cbor_build_bool(false)));
  put(map.get(), "flatfield_enabled", owned(cbor_build_bool(false)));
  put(map.get(), "virtual_pixel_interpolation_enabled", owned(cbor_build_bool(false)));
  put(map.get(), "user_data", owned(cbor_new_definite_map(0)));
  Item thresholds = owned(cbor_new_definite_map(info.channels.size()));
  for (std::size_t c = 0; c < info.channels.size(); ++c) {
    // 6 keV and up, a channel 2 keV above the one before (an EIGER2's two thresholds)
    put(thresholds.get(), info.channels[c],
        owned(cbor_build_float8(6000.0 + 2000.0 * static_cast<double>(c))));
  }
  put(map.get(), "threshold_energy", std::move(thresholds));
  const unsigned bits = info.dtype == "uint8" ? 8 : info.dtype == "uint16" ? 16 : 32;
  put(map.get(), "saturation_value", owned(cbor_build_uint64((std::uint64_t{1} << bits) - 2)));
  if (!info.goniometer.empty()) {
    Item axes = owned(cbor_new_definite_map(info.goniometer.size()));
    for (const auto& a : info.goniometer) {
      Item axis = owned(cbor_new_definite_map(2));
      put(axis.get(), "increment", owned(cbor_build_float8(a.increment)));
      put(axis.get(), "start", owned(cbor_build_float8(a.start)));
      put(axes.get(), a.name, std::move(axis));
    }
    put(map.get(), "goniometer", std::move(axes));
  }
  Item channels = owned(cbor_new_definite_array(info.channels.size()));
  Item masks = owned(cbor_new_definite_map(info.channels.size()));
  std::vector<std::byte> mask(info.pixel_mask ? info.dims.at(0) * info.dims.at(1) * 4 : 0);
  if (!mask.empty()) mask[0] = std::byte{1};  // pixel (0, 0): a gap, as masks mark them
  for (const auto& c : info.channels) {
    push(channels.get(), owned(cbor_build_string(c.c_str())));
    if (info.pixel_mask) put(masks.get(), c, multidim(info.dims, "uint32", bytes_item(mask)));
  }
  put(map.get(), "channels", std::move(channels));
  if (info.pixel_mask) put(map.get(), "pixel_mask", std::move(masks));
  return serialize(std::move(map));
}

std::vector<std::byte> build_image(std::uint64_t series_id, const std::string& series_unique_id,
                                   std::uint64_t image_id, const std::vector<std::uint64_t>& dims,
                                   const std::string& dtype, Compression compression,
                                   const std::vector<ChannelPixels>& channels,
                                   const ImageTimes* times) {
  const TypedTag* t = typed_tag(dtype);
  if (!t) throw std::invalid_argument("stream2: no typed array tag for dtype \"" + dtype + "\"");
  Item map = header("image", series_id, series_unique_id, times ? 6 : 2);
  put(map.get(), "image_id", owned(cbor_build_uint64(image_id)));
  if (times) {
    put(map.get(), "series_date",
        tagged(kDateTime, owned(cbor_build_string(times->series_date.c_str()))));
    const std::pair<const char*, std::uint64_t> fields[] = {
        {"start_time", times->start}, {"stop_time", times->stop}, {"real_time", times->real}};
    for (const auto& [name, ticks] : fields) {
      Item rational = owned(cbor_new_definite_array(2));
      push(rational.get(), owned(cbor_build_uint64(ticks)));
      push(rational.get(), owned(cbor_build_uint64(times->ticks_per_second)));
      put(map.get(), name, std::move(rational));
    }
  }
  Item data = owned(cbor_new_definite_map(channels.size()));
  for (const auto& c : channels) {
    Item content = bytes_item(c.bytes);
    if (compression != Compression::none) {
      Item triple = owned(cbor_new_definite_array(3));
      push(triple.get(), owned(cbor_build_string(compression_name(compression))));
      push(triple.get(), owned(cbor_build_uint64(t->size)));
      push(triple.get(), std::move(content));
      content = tagged(kCompressed, std::move(triple));
    }
    put(data.get(), c.name, multidim(dims, dtype, std::move(content)));
  }
  put(map.get(), "data", std::move(data));
  return serialize(std::move(map));
}

std::vector<std::byte> build_end(std::uint64_t series_id, const std::string& series_unique_id,
                                 const std::string& incomplete) {
  Item map = header("end", series_id, series_unique_id, incomplete.empty() ? 0 : 1);
  if (!incomplete.empty()) {
    Item ours = owned(cbor_new_definite_map(2));
    put(ours.get(), "incomplete", owned(cbor_build_bool(true)));
    put(ours.get(), "reason", owned(cbor_build_string(incomplete.c_str())));
    put(map.get(), kOurs, std::move(ours));
  }
  return serialize(std::move(map));
}

}  // namespace numastream::stream2
