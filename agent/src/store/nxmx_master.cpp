#include "store/nxmx_master.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <stdexcept>

#include "base/error.hpp"
#include "detector/stream2.hpp"
#include "store/hdf5_detail.hpp"

namespace numastream::hdf5 {

using namespace detail;

namespace {

constexpr const char* kDetector = "/entry/instrument/detector";
constexpr const char* kNumastream = "/entry/numastream";

// What the start message says that NXmx asks for in its own names.
struct StartFacts {
  std::optional<std::string> arm_date;
  std::map<std::string, double> number;  // top-level numeric fields
  std::vector<double> translation;
  std::vector<std::string> channels;
  std::string image_dtype;
  struct Axis {
    std::optional<double> start, increment;
  };
  std::map<std::string, Axis> goniometer;  // goniometer/<axis>/{start,increment}
  std::string first_mask;                  // the channel whose pixel_mask came first
};

std::optional<double> numeric(const stream2::Value& v) {
  using K = stream2::Value::Kind;
  if (v.kind == K::unsigned_integer) return static_cast<double>(v.u);
  if (v.kind == K::integer) return static_cast<double>(v.i);
  if (v.kind == K::real) return v.d;
  return std::nullopt;
}

// The start message's fields NXdetector has under its own names, with the units Stream V2
// documents for them. A field of one value per channel (pixel_mask, threshold_energy) gives its
// first channel's (every channel's stays in detectorSpecific).
struct NxName {
  const char* name;
  const char* units;  // nullptr: none
};
const std::map<std::string, NxName>& nx_names() {
  static const std::map<std::string, NxName> names = {
      {"beam_center_x", {"beam_center_x", "pixel"}},
      {"beam_center_y", {"beam_center_y", "pixel"}},
      {"count_time", {"count_time", "s"}},
      {"frame_time", {"frame_time", "s"}},
      {"sensor_material", {"sensor_material", nullptr}},
      {"sensor_thickness", {"sensor_thickness", "m"}},
      {"saturation_value", {"saturation_value", nullptr}},
      {"detector_description", {"description", nullptr}},
      {"detector_serial_number", {"serial_number", nullptr}},
      {"pixel_mask_enabled", {"pixel_mask_applied", nullptr}},
      {"countrate_correction_enabled", {"countrate_correction_applied", nullptr}},
      {"flatfield_enabled", {"flatfield_applied", nullptr}},
      {"virtual_pixel_interpolation_enabled", {"virtual_pixel_interpolation_applied", nullptr}},
      {"pixel_mask", {"pixel_mask", nullptr}},
      {"threshold_energy", {"threshold_energy", "eV"}},
  };
  return names;
}

// The units of the start message's fields as Stream V2 documents them (on detectorSpecific's).
const std::map<std::string, const char*>& field_units() {
  static const std::map<std::string, const char*> units = {
      {"count_time", "s"},        {"frame_time", "s"},
      {"sensor_thickness", "m"},  {"pixel_size_x", "m"},
      {"pixel_size_y", "m"},      {"detector_translation", "m"},
      {"beam_center_x", "pixel"}, {"beam_center_y", "pixel"},
      {"incident_energy", "eV"},  {"incident_wavelength", "angstrom"}};
  return units;
}

void text_field(hid_t file, const std::string& path, const std::string& value,
                const std::string& what) {
  hid_t t = vlen_text();
  hid_t scalar = H5Screate(H5S_SCALAR);
  const char* p = value.c_str();
  dataset(file, path, t, t, scalar, &p, what);
  H5Sclose(scalar);
  H5Tclose(t);
}

void attribute_on(hid_t file, const std::string& path, const char* name, const std::string& value,
                  const std::string& what) {
  hid_t o = H5Oopen(file, path.c_str(), H5P_DEFAULT);
  if (o < 0) fail(what, "open " + path);
  if (H5Aexists(o, name) > 0) H5Adelete(o, name);
  text_attribute(o, name, value, what);
  H5Oclose(o);
}

void vector_attribute(hid_t obj, const char* name, const double (&v)[3], const std::string& what) {
  const hsize_t n = 3;
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t attr = H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_DOUBLE, v) >= 0;
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space);
  if (!ok) fail(what, std::string("write attribute ") + name);
}

// A scalar number `value` in `units` that is one step of a chain of NXtransformations: moved
// along (translation) `vector` by it, after `depends_on`.
void axis(hid_t file, const std::string& path, double value, const char* units,
          const double (&vector)[3], const double (&offset)[3], const std::string& depends_on,
          const std::string& what) {
  hid_t scalar = H5Screate(H5S_SCALAR);
  dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, scalar, &value, what);
  H5Sclose(scalar);
  hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) fail(what, "open " + path);
  text_attribute(d, "units", units, what);
  text_attribute(d, "transformation_type", "translation", what);
  vector_attribute(d, "vector", vector, what);
  vector_attribute(d, "offset", offset, what);
  text_attribute(d, "offset_units", "m", what);
  text_attribute(d, "depends_on", depends_on, what);
  H5Dclose(d);
}

void int_pair(hid_t file, const std::string& path, std::int64_t a, std::int64_t b,
              const std::string& what) {
  const hsize_t n = 2;
  const std::int64_t v[2] = {a, b};
  hid_t space = H5Screate_simple(1, &n, nullptr);
  dataset(file, path, H5T_STD_I64LE, H5T_NATIVE_INT64, space, v, what);
  H5Sclose(space);
}

// ISO 8601 "YYYY-MM-DDTHH:MM:SS[.fff](Z|+hh:mm|-hh:mm)" as seconds since the epoch; nullopt when
// it is not one.
std::optional<double> parse_time(const std::string& text) {
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  double t = static_cast<double>(timegm(&tm));
  const char* p = text.c_str() + consumed;
  if (*p == '.') {
    char* end = nullptr;
    t += std::strtod(p, &end);
    p = end;
  }
  if (*p == 'Z' || *p == 'z') return t;
  int hh = 0, mm = 0;
  if ((*p == '+' || *p == '-') && std::sscanf(p + 1, "%2d:%2d", &hh, &mm) == 2) {
    return t - (*p == '+' ? 1 : -1) * (hh * 3600.0 + mm * 60.0);
  }
  return std::nullopt;
}

std::string format_time(double t) {
  const auto secs = static_cast<std::time_t>(std::floor(t));
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char stamp[40];
  const std::size_t n = std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(stamp + n, sizeof(stamp) - n, ".%03dZ",
                static_cast<int>((t - std::floor(t)) * 1000));
  return stamp;
}

// The goniometer axes NXmx's sample chain is built from, innermost first (the sample sits on phi,
// phi on chi, chi on omega), with their rotation vectors in NeXus's (McStas) coordinates: omega
// and phi about -x, chi about +z, as the NXmx Gold Standard's single-axis and three-circle
// goniometers have them. An axis the start message names that is not here stays in
// detectorSpecific only.
struct KnownAxis {
  const char* name;
  double vector[3];
};
constexpr KnownAxis kAxes[] = {{"phi", {-1, 0, 0}}, {"chi", {0, 0, 1}}, {"omega", {-1, 0, 0}}};

// The value a pixel of `dtype` has where the detector has no data (all bits set): what a virtual
// dataset gives for an image no data file holds yet, and what readers mask.
std::uint64_t no_data(const std::string& dtype) {
  if (dtype == "uint8") return 0xff;
  if (dtype == "uint16") return 0xffff;
  return 0xffffffff;
}

// The per-image times the data files hold under the detector (SeriesFile::write_image).
constexpr const char* kImageTimes[] = {"start_time", "stop_time", "real_time"};

bool path_exists(hid_t f, const std::string& at) {
  std::size_t pos = 0;
  while ((pos = at.find('/', pos + 1)) != std::string::npos) {
    if (H5Lexists(f, at.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return H5Lexists(f, at.c_str(), H5P_DEFAULT) > 0;
}

bool path_exists(const std::string& file_path) { return ::access(file_path.c_str(), F_OK) == 0; }

int bits_of(const std::string& dtype) { return dtype == "uint8" ? 8 : dtype == "uint16" ? 16 : 32; }

void scalar_u64(hid_t file, const std::string& path, std::uint64_t v, const std::string& what) {
  hid_t scalar = H5Screate(H5S_SCALAR);
  dataset(file, path, H5T_STD_U64LE, H5T_NATIVE_UINT64, scalar, &v, what);
  H5Sclose(scalar);
}

void scalar_f64(hid_t file, const std::string& path, double v, const char* units,
                const std::string& what) {
  hid_t scalar = H5Screate(H5S_SCALAR);
  dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, scalar, &v, what);
  H5Sclose(scalar);
  if (units) attribute_on(file, path, "units", units, what);
}

void f64_array(hid_t file, const std::string& path, const std::vector<double>& v,
               const std::string& what) {
  const hsize_t n = v.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  dataset(file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, space, v.data(), what);
  H5Sclose(space);
}

// The images each of `datasets` holds in a data file left unfinished (a .part of a series given
// up), by dataset path; empty when it does not open.
std::map<std::string, hsize_t> extents_of(const std::string& file_path,
                                          const std::vector<std::string>& datasets) {
  std::map<std::string, hsize_t> out;
  hid_t f = H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return out;
  for (const auto& at : datasets) {
    if (!path_exists(f, at)) continue;
    hid_t d = H5Dopen2(f, at.c_str(), H5P_DEFAULT);
    hid_t space = d >= 0 ? H5Dget_space(d) : -1;
    hsize_t dims[3] = {0, 0, 0};
    if (space >= 0 && H5Sget_simple_extent_ndims(space) >= 1 &&
        H5Sget_simple_extent_dims(space, dims, nullptr) >= 1) {
      out[at] = dims[0];
    }
    if (space >= 0) H5Sclose(space);
    if (d >= 0) H5Dclose(d);
  }
  H5Fclose(f);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

// What one virtual dataset of the master maps: `images` entries of `source` in the data files
// (file k holds images (k-1) * per_file ..), each entry of shape `inner` (rows x cols for an
// image, none for a per-image value), of `type`, reading `fill` (given as `fill_type`) where no
// published data file holds it yet; a data file a given-up series left unfinished
// (`unfinished`: by number, the entries of each source it holds) maps what it holds by its .part
// name.
struct Mapping {
  std::string source;
  std::vector<hsize_t> inner;
  hid_t type, fill_type;
  const void* fill;
};

void virtual_over_files(hid_t file, const std::string& at, std::uint64_t images, const Mapping& map,
                        const NxmxMaster& m,
                        const std::map<std::uint64_t, std::map<std::string, hsize_t>>& unfinished,
                        const std::string& what) {
  const int rank = static_cast<int>(map.inner.size()) + 1;
  std::vector<hsize_t> dims = {images};
  dims.insert(dims.end(), map.inner.begin(), map.inner.end());
  hid_t vspace = H5Screate_simple(rank, dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_fill_value(dcpl, map.fill_type, map.fill);
  bool ok = true;
  for (std::uint64_t k = 1; ok && (k - 1) * m.frames_per_file < images; ++k) {
    const std::uint64_t first = (k - 1) * m.frames_per_file;
    hsize_t count = std::min<std::uint64_t>(m.frames_per_file, images - first);
    std::string source = data_file_name(m.data_prefix, k);
    if (const auto it = unfinished.find(k); it != unfinished.end()) {
      const auto e = it->second.find(map.source);
      if (e == it->second.end() || e->second == 0)
        continue;  // nothing of it written: the fill value
      count = std::min<hsize_t>(count, e->second);
      source += ".part";
    }
    std::vector<hsize_t> start(static_cast<std::size_t>(rank), 0), block = {count};
    start[0] = first;
    block.insert(block.end(), map.inner.begin(), map.inner.end());
    hid_t src = H5Screate_simple(rank, block.data(), nullptr);
    ok = H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start.data(), nullptr, block.data(),
                             nullptr) >= 0 &&
         H5Pset_virtual(dcpl, vspace, source.c_str(), map.source.c_str(), src) >= 0;
    H5Sclose(src);
  }
  H5Sselect_all(vspace);
  hid_t d =
      ok ? H5Dcreate2(file, at.c_str(), map.type, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT) : -1;
  ok = d >= 0;
  if (ok) H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(vspace);
  if (!ok) fail(what, "the virtual dataset " + at);
}

void write_body(hid_t file, const std::string& path, const NxmxMaster& m) {
  group(file, "/entry", "NXentry", path);
  group(file, "/entry/data", "NXdata", path);
  group(file, "/entry/instrument", "NXinstrument", path);
  group(file, kDetector, "NXdetector", path);
  group(file, "/entry/instrument/beam", "NXbeam", path);
  group(file, "/entry/sample", "NXsample", path);
  group(file, "/entry/source", "NXsource", path);
  group(file, kNumastream, "NXcollection", path);
  hid_t root = H5Gopen2(file, "/", H5P_DEFAULT);
  text_attribute(root, "default", "entry", path);
  H5Gclose(root);

  // The start message: every field in the detector's detectorSpecific (as the one-file layout
  // stores them under the detector), those NXdetector names under its names. The per-channel
  // pixel masks are detectorSpecific/pixel_mask_<channel>, the first channel's also
  // detectorSpecific/pixel_mask and the NXdetector's pixel_mask (2-d datasets, as XDS's readers
  // and DIALS read them).
  StartFacts facts;
  const std::string specific = std::string(kDetector) + "/detectorSpecific";
  if (!m.start.empty()) {
    group(file, specific, "NXcollection", path);
    std::vector<std::string> skipped;
    std::string error;
    const bool ok = stream2::walk(
        m.start,
        [&](const std::string& field, const stream2::Value& v) {
          const auto slash = field.find('/');
          const std::string top = field.substr(0, slash);
          using K = stream2::Value::Kind;
          if (top == "pixel_mask" && slash != std::string::npos) {
            const std::string channel = field.substr(slash + 1);
            write_value(file, specific + "/pixel_mask_" + channel, v, path);
            if (facts.first_mask.empty() && v.kind == K::array && v.array.dims.size() == 2) {
              facts.first_mask = channel;
              write_value(file, specific + "/pixel_mask", v, path);
              write_value(file, std::string(kDetector) + "/pixel_mask", v, path);
            }
            return;
          }
          write_value(file, specific + "/" + field, v, path);
          const auto nx = nx_names().find(top);
          if (nx != nx_names().end() && top != "pixel_mask" &&
              (slash == std::string::npos) == (top != "threshold_energy")) {
            const std::string at = std::string(kDetector) + "/" + nx->second.name;
            write_value(file, at, v, path);  // the first channel's, for a per-channel field
            if (nx->second.units) attribute_on(file, at, "units", nx->second.units, path);
          }
          if (const auto x = numeric(v)) facts.number.emplace(field, *x);
          if (field == "arm_date" && v.kind == K::text) facts.arm_date = std::string(v.s);
          if (field == "image_dtype" && v.kind == K::text) facts.image_dtype = std::string(v.s);
          if (field == "detector_translation" && v.kind == K::reals) facts.translation = v.reals;
          if (field == "channels" && v.kind == K::texts)
            facts.channels.assign(v.texts.begin(), v.texts.end());
          if (top == "goniometer") {
            const auto second = field.find('/', slash + 1);
            const auto x = numeric(v);
            if (second != std::string::npos && x) {
              auto& axis = facts.goniometer[field.substr(slash + 1, second - slash - 1)];
              const std::string what = field.substr(second + 1);
              if (what == "start") axis.start = *x;
              if (what == "increment") axis.increment = *x;
            }
          }
        },
        skipped, error);
    if (!ok) throw std::runtime_error(path + ": the start message: " + error);
    const hsize_t n = m.start.size();
    hid_t space = H5Screate_simple(1, &n, nullptr);
    dataset(file, std::string(kDetector) + "/stream2_start", H5T_STD_U8LE, H5T_NATIVE_UINT8, space,
            m.start.data(), path);
    H5Sclose(space);
    for (const auto& [field, units] : field_units()) {
      const std::string p = specific + "/" + field;
      if (H5Lexists(file, p.c_str(), H5P_DEFAULT) > 0) attribute_on(file, p, "units", units, path);
    }
  }
  auto number = [&](const char* field) -> std::optional<double> {
    auto it = facts.number.find(field);
    return it == facts.number.end() ? std::nullopt : std::optional(it->second);
  };

  // /entry: what NXmx asks of it.
  text_field(file, "/entry/definition", "NXmx", path);
  attribute_on(file, "/entry/definition", "version", "1.0", path);
  hid_t entry = H5Gopen2(file, "/entry", H5P_DEFAULT);
  text_attribute(entry, "default", "data", path);
  u64_attribute(entry, "series_id", m.series_id, path);
  text_attribute(entry, "series_unique_id", m.series_unique_id, path);
  if (!m.incomplete.empty()) text_attribute(entry, "incomplete", m.incomplete, path);
  H5Gclose(entry);
  const std::string start_time = facts.arm_date.value_or(m.start_time);
  text_field(file, "/entry/start_time", start_time, path);
  std::string estimated = start_time;
  const auto images = number("number_of_images");
  if (const auto t0 = parse_time(start_time); t0 && images) {
    estimated = format_time(
        *t0 + *images * number("frame_time").value_or(number("count_time").value_or(0)));
  }
  text_field(file, "/entry/end_time_estimated", estimated, path);
  if (!m.end_time.empty()) text_field(file, "/entry/end_time", m.end_time, path);

  // /entry/data: a link to every data file the series will have (dangling until it is written),
  // as DECTRIS's file writer links them (what XDS's readers open), and the virtual datasets over
  // them (what NXdata's signal names: DIALS, silx and h5py read the series as one stack).
  hid_t data = H5Gopen2(file, "/entry/data", H5P_DEFAULT);
  text_attribute(data, "signal", "data", path);
  const std::uint64_t count = images ? static_cast<std::uint64_t>(*images) : 0;
  std::vector<std::string> stacks = {"data"};
  for (const auto& c : facts.channels) {
    if (c != "data") stacks.push_back(c);
  }
  if (count > 0 && m.frames_per_file > 0) {
    const std::uint64_t files = (count + m.frames_per_file - 1) / m.frames_per_file;
    for (std::uint64_t k = 1; k <= files; ++k) {
      char suffix[16];
      std::snprintf(suffix, sizeof(suffix), "_%06llu", static_cast<unsigned long long>(k));
      const std::string target = data_file_name(m.data_prefix, k);
      bool ok =
          H5Lcreate_external(target.c_str(), "/entry/data/data", data,
                             (std::string("data") + suffix).c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0;
      for (const auto& c : facts.channels) {
        if (!ok) break;
        ok = H5Lcreate_external(target.c_str(), ("/entry/data/" + c).c_str(), data,
                                (c + suffix).c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0;
      }
      if (!ok) {
        H5Gclose(data);
        fail(path, "link data file " + target);
      }
    }
  }
  H5Gclose(data);
  const auto rows = number("image_size_y"), cols = number("image_size_x");
  const bool stackable = count > 0 && m.frames_per_file > 0 && rows && cols &&
                         (facts.image_dtype == "uint8" || facts.image_dtype == "uint16" ||
                          facts.image_dtype == "uint32");
  if (stackable) {
    // The data files an unfinished series left as .part: what each of their datasets holds.
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
    std::vector<std::string> sources;
    sources.reserve(stacks.size());
    for (const auto& name : stacks) sources.push_back("/entry/data/" + name);
    for (const char* t : kImageTimes) sources.push_back(std::string(kDetector) + "/" + t);
    std::map<std::uint64_t, std::map<std::string, hsize_t>> unfinished;
    for (const auto k : m.unfinished)
      unfinished[k] = extents_of(dir + data_file_name(m.data_prefix, k) + ".part", sources);
    const std::uint64_t fill = no_data(facts.image_dtype);
    hid_t type = file_type(facts.image_dtype);
    for (const auto& name : stacks) {
      const std::string at = "/entry/data/" + name;
      const Mapping stack{at,
                          {static_cast<hsize_t>(*rows), static_cast<hsize_t>(*cols)},
                          type,
                          H5T_NATIVE_UINT64,
                          &fill};
      virtual_over_files(file, at, count, stack, m, unfinished, path);
      attribute_on(file, at, "interpretation", "image", path);
    }
    // Each image's start, stop and real time (seconds from the series' date) as the data files
    // hold them from the image messages, when the first data file has them (NaN where an image
    // has not come).
    const std::string first_file = dir + data_file_name(m.data_prefix, 1);
    const auto present =
        extents_of(path_exists(first_file) ? first_file : first_file + ".part", sources);
    const double nan = std::nan("");
    for (const char* t : kImageTimes) {
      const std::string at = std::string(kDetector) + "/" + t;
      if (!present.count(at)) continue;
      virtual_over_files(file, at, count, Mapping{at, {}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &nan},
                         m, unfinished, path);
      attribute_on(file, at, "units", "s", path);
    }
  }

  // The instrument, the beam, the source.
  text_field(file, "/entry/instrument/name", m.instrument.empty() ? "unknown" : m.instrument, path);
  text_field(file, "/entry/source/name", m.source.empty() ? "unknown" : m.source, path);
  text_field(file, "/entry/sample/name", m.sample.empty() ? "unknown" : m.sample, path);
  std::optional<double> wavelength = number("incident_wavelength");
  if (!wavelength && number("incident_energy") && *number("incident_energy") > 0) {
    wavelength = 12398.4198 / *number("incident_energy");  // hc in eV * angstrom
  }
  if (wavelength) {
    scalar_f64(file, "/entry/instrument/beam/incident_wavelength", *wavelength, "angstrom", path);
  }

  // The sample: the goniometer's axes (kAxes) the start message gives, as a chain of rotations
  // with an angle per image (start + i x increment) when one of them turns, so a rotation series
  // is one sweep; a series where none turns is a series of stills (depends_on ".").
  std::string sample_depends_on = ".";
  const bool turns = std::any_of(facts.goniometer.begin(), facts.goniometer.end(),
                                 [](const auto& a) { return a.second.increment.value_or(0) != 0; });
  if (turns && count > 0) {
    const std::string tr = "/entry/sample/transformations";
    group(file, tr, "NXtransformations", path);
    std::string depends_on = ".";
    const double zero[3] = {0, 0, 0};
    for (auto a = std::rbegin(kAxes); a != std::rend(kAxes); ++a) {  // outermost first
      const auto it = facts.goniometer.find(a->name);
      if (it == facts.goniometer.end()) continue;
      const double start = it->second.start.value_or(0), step = it->second.increment.value_or(0);
      std::vector<double> angles(count), ends(count);
      for (std::uint64_t i = 0; i < count; ++i) {
        angles[i] = start + static_cast<double>(i) * step;
        ends[i] = angles[i] + step;
      }
      const std::string at = tr + "/" + a->name;
      f64_array(file, at, angles, path);
      hid_t d = H5Dopen2(file, at.c_str(), H5P_DEFAULT);
      text_attribute(d, "units", "deg", path);
      text_attribute(d, "transformation_type", "rotation", path);
      vector_attribute(d, "vector", a->vector, path);
      vector_attribute(d, "offset", zero, path);
      text_attribute(d, "offset_units", "m", path);
      text_attribute(d, "depends_on", depends_on, path);
      H5Dclose(d);
      f64_array(file, at + "_end", ends, path);
      attribute_on(file, at + "_end", "units", "deg", path);
      scalar_f64(file, at + "_increment_set", step, "deg", path);
      depends_on = at;
    }
    sample_depends_on = depends_on;
  }
  text_field(file, "/entry/sample/depends_on", sample_depends_on, path);

  // The detector in NXmx's names and geometry: where it is (detector_translation), where its
  // pixels are (the beam centre on the beam axis, fast pixels along -x, slow along -y).
  const std::string det = kDetector;
  const auto px = number("pixel_size_x"), py = number("pixel_size_y");
  for (const auto& [name, v] : {std::pair{"x_pixel_size", px}, std::pair{"y_pixel_size", py}}) {
    if (!v) continue;
    scalar_f64(file, det + "/" + name, *v, "m", path);
    if (!m.start.empty()) scalar_f64(file, specific + "/" + name, *v, "m", path);
  }
  group(file, det + "/transformations", "NXtransformations", path);
  double t[3] = {0, 0, 0};
  if (facts.translation.size() == 3)
    std::copy(facts.translation.begin(), facts.translation.end(), t);
  const double length = std::sqrt(t[0] * t[0] + t[1] * t[1] + t[2] * t[2]);
  const double along[3] = {length > 0 ? t[0] / length : 0, length > 0 ? t[1] / length : 0,
                           length > 0 ? t[2] / length : 1};
  const double zero[3] = {0, 0, 0};
  const std::string translation = det + "/transformations/translation";
  axis(file, translation, length, "m", along, zero, ".", path);
  text_field(file, det + "/depends_on", translation, path);
  if (facts.translation.size() == 3) scalar_f64(file, det + "/distance", length, "m", path);
  if (!facts.image_dtype.empty()) {
    for (const char* name : {"bit_depth_image", "bit_depth_readout"}) {
      scalar_u64(file, det + "/" + name, static_cast<std::uint64_t>(bits_of(facts.image_dtype)),
                 path);
    }
  }
  // What XDS's readers (Neggia, Durin) take from DECTRIS's detectorSpecific. Neggia refuses a
  // master without a pixel mask: a start message without one gets a mask of no pixel masked
  // (uint8 zeros), which says so.
  if (!m.start.empty() && facts.first_mask.empty() && rows && cols) {
    const hsize_t dims[2] = {static_cast<hsize_t>(*rows), static_cast<hsize_t>(*cols)};
    const std::vector<std::uint8_t> none(dims[0] * dims[1], 0);
    hid_t space = H5Screate_simple(2, dims, nullptr);
    for (const std::string& at : {det + "/pixel_mask", specific + "/pixel_mask"}) {
      dataset(file, at, H5T_STD_U8LE, H5T_NATIVE_UINT8, space, none.data(), path);
      attribute_on(file, at, "description",
                   "the start message carried no pixel mask: no pixel is masked", path);
    }
    H5Sclose(space);
  }
  if (!m.start.empty()) {
    if (count > 0) scalar_u64(file, specific + "/nimages", count, path);
    scalar_u64(file, specific + "/ntrigger", 1, path);
    if (rows && cols) {
      scalar_u64(file, specific + "/x_pixels_in_detector", static_cast<std::uint64_t>(*cols), path);
      scalar_u64(file, specific + "/y_pixels_in_detector", static_cast<std::uint64_t>(*rows), path);
    }
  }
  if (rows && cols && px && py) {
    const std::string module = det + "/module";
    group(file, module, "NXdetector_module", path);
    int_pair(file, module + "/data_origin", 0, 0, path);
    int_pair(file, module + "/data_size", static_cast<std::int64_t>(*rows),
             static_cast<std::int64_t>(*cols), path);
    const double bx = number("beam_center_x").value_or(0) * *px,
                 by = number("beam_center_y").value_or(0) * *py;
    const double offset_length = std::sqrt(bx * bx + by * by);
    const double offset_along[3] = {offset_length > 0 ? bx / offset_length : 1,
                                    offset_length > 0 ? by / offset_length : 0, 0};
    axis(file, module + "/module_offset", offset_length, "m", offset_along, zero, translation,
         path);
    const double fast[3] = {-1, 0, 0}, slow[3] = {0, -1, 0};
    axis(file, module + "/fast_pixel_direction", *px, "m", fast, zero, module + "/module_offset",
         path);
    axis(file, module + "/slow_pixel_direction", *py, "m", slow, zero, module + "/module_offset",
         path);
  }

  // What a restarted gateway reads back.
  hid_t g = H5Gopen2(file, kNumastream, H5P_DEFAULT);
  u64_attribute(g, "stream_id", m.stream_id, path);
  u64_attribute(g, "frames_per_file", m.frames_per_file, path);
  text_attribute(g, "data_prefix", m.data_prefix, path);
  text_attribute(g, "gateway_start_time", m.start_time, path);
  text_attribute(g, "instrument", m.instrument, path);
  text_attribute(g, "source", m.source, path);
  text_attribute(g, "sample", m.sample, path);
  if (m.start_sequence) u64_attribute(g, "start_sequence", *m.start_sequence, path);
  if (m.end_sequence) u64_attribute(g, "end_sequence", *m.end_sequence, path);
  H5Gclose(g);
}

}  // namespace

std::string data_file_name(const std::string& prefix, std::uint64_t k) {
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "_data_%06llu.h5", static_cast<unsigned long long>(k));
  return prefix + suffix;
}

void write_master(const std::string& path, const NxmxMaster& m) {
  quiet();
  const std::string tmp = path + ".tmp";
  hid_t file = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) fail(tmp, "create the file");
  try {
    write_body(file, tmp, m);
  } catch (...) {
    H5Fclose(file);
    H5Eclear2(H5E_DEFAULT);
    std::remove(tmp.c_str());
    throw;
  }
  // Closing a file with datasets whose filter HDF5 has not loaded leaves an error on its stack
  // (see SeriesFile::close): cleared.
  const bool closed = H5Fclose(file) >= 0;
  H5Eclear2(H5E_DEFAULT);
  if (!closed) throw std::runtime_error(tmp + ": close failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("rename " + tmp + " to " + path + ": " + errno_text(errno));
  }
}

std::optional<NxmxMaster> read_master(const std::string& path) {
  quiet();
  if (H5Fis_hdf5(path.c_str()) <= 0) return std::nullopt;
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return std::nullopt;
  std::optional<NxmxMaster> out;
  if (H5Lexists(file, "/entry", H5P_DEFAULT) > 0 && H5Lexists(file, kNumastream, H5P_DEFAULT) > 0) {
    hid_t entry = H5Gopen2(file, "/entry", H5P_DEFAULT);
    hid_t g = H5Gopen2(file, kNumastream, H5P_DEFAULT);
    const auto series = read_u64_attribute(entry, "series_id");
    const auto per_file = read_u64_attribute(g, "frames_per_file");
    if (series && per_file) {
      NxmxMaster m;
      m.series_id = *series;
      m.series_unique_id = read_text_attribute(entry, "series_unique_id");
      m.incomplete = read_text_attribute(entry, "incomplete");
      m.stream_id = static_cast<std::uint32_t>(read_u64_attribute(g, "stream_id").value_or(0));
      m.frames_per_file = *per_file;
      m.data_prefix = read_text_attribute(g, "data_prefix");
      m.start_time = read_text_attribute(g, "gateway_start_time");
      m.instrument = read_text_attribute(g, "instrument");
      m.source = read_text_attribute(g, "source");
      m.sample = read_text_attribute(g, "sample");
      m.start_sequence = read_u64_attribute(g, "start_sequence");
      m.end_sequence = read_u64_attribute(g, "end_sequence");
      bool ok = true;
      if (H5Lexists(file, "/entry/end_time", H5P_DEFAULT) > 0) {
        hid_t d = H5Dopen2(file, "/entry/end_time", H5P_DEFAULT);
        hid_t t = vlen_text();
        char* p = nullptr;
        ok = d >= 0 && H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p) >= 0 && p;
        if (ok) m.end_time = p;
        if (p) H5free_memory(p);
        H5Tclose(t);
        if (d >= 0) H5Dclose(d);
      }
      const std::string start = std::string(kDetector) + "/stream2_start";
      if (ok && H5Lexists(file, "/entry/instrument", H5P_DEFAULT) > 0 &&
          H5Lexists(file, kDetector, H5P_DEFAULT) > 0 &&
          H5Lexists(file, start.c_str(), H5P_DEFAULT) > 0) {
        hid_t d = H5Dopen2(file, start.c_str(), H5P_DEFAULT);
        hid_t space = H5Dget_space(d);
        hsize_t n = 0;
        H5Sget_simple_extent_dims(space, &n, nullptr);
        m.start.resize(n);
        ok = H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.start.data()) >= 0;
        H5Sclose(space);
        H5Dclose(d);
      }
      if (ok) out = std::move(m);
    }
    H5Gclose(g);
    H5Gclose(entry);
  }
  H5Fclose(file);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

}  // namespace numastream::hdf5
