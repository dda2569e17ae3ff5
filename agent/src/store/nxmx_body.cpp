// The NXmx master file's layout: NeXus's groups, the start message's fields under NXmx's names and
// in DECTRIS's detectorSpecific, links and virtual datasets over the data files, the goniometer
// and detector geometry, and the gateway's own record.
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
#include "store/nxmx_layout.hpp"
#include "store/nxmx_master.hpp"

namespace numastream::hdf5 {

using namespace detail;

namespace {

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

bool path_exists(const std::string& file_path) { return ::access(file_path.c_str(), F_OK) == 0; }

int bits_of(const std::string& dtype) { return dtype == "uint8" ? 8 : dtype == "uint16" ? 16 : 32; }

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

// The master file's layout, written part by part from the start message and the gateway's record.
class MasterBody {
 public:
  MasterBody(hid_t file, const std::string& path, const NxmxMaster& m)
      : file_(file), path_(path), m_(m), specific_(std::string(kDetector) + "/detectorSpecific") {}

  void write() {
    groups();
    if (!m_.start.empty()) start_message();
    const auto images = number("number_of_images");
    count_ = images ? static_cast<std::uint64_t>(*images) : 0;
    rows_ = number("image_size_y"), cols_ = number("image_size_x");
    entry();
    data_links();
    stacks();
    instrument();
    sample();
    detector();
    detector_specific();
    module();
    own_record();
  }

 private:
  std::optional<double> number(const char* field) const {
    auto it = facts_.number.find(field);
    return it == facts_.number.end() ? std::nullopt : std::optional(it->second);
  }

  void groups() {
    group(file_, "/entry", "NXentry", path_);
    group(file_, "/entry/data", "NXdata", path_);
    group(file_, "/entry/instrument", "NXinstrument", path_);
    group(file_, kDetector, "NXdetector", path_);
    group(file_, "/entry/instrument/beam", "NXbeam", path_);
    group(file_, "/entry/sample", "NXsample", path_);
    group(file_, "/entry/source", "NXsource", path_);
    group(file_, kNumastream, "NXcollection", path_);
    hid_t root = H5Gopen2(file_, "/", H5P_DEFAULT);
    text_attribute(root, "default", "entry", path_);
    H5Gclose(root);
  }

  // The start message: every field in the detector's detectorSpecific (as the one-file layout
  // stores them under the detector), those NXdetector names under its names. The per-channel
  // pixel masks are detectorSpecific/pixel_mask_<channel>, the first channel's also
  // detectorSpecific/pixel_mask and the NXdetector's pixel_mask (2-d datasets, as XDS's readers
  // and DIALS read them).
  void start_message() {
    group(file_, specific_, "NXcollection", path_);
    std::vector<std::string> skipped;
    std::string error;
    const bool ok = stream2::walk(
        m_.start, [&](const std::string& field, const stream2::Value& v) { start_field(field, v); },
        skipped, error);
    if (!ok) throw std::runtime_error(path_ + ": the start message: " + error);
    const hsize_t n = m_.start.size();
    hid_t space = H5Screate_simple(1, &n, nullptr);
    dataset(file_, std::string(kDetector) + "/stream2_start", H5T_STD_U8LE, H5T_NATIVE_UINT8, space,
            m_.start.data(), path_);
    H5Sclose(space);
    for (const auto& [field, units] : field_units()) {
      const std::string p = specific_ + "/" + field;
      if (H5Lexists(file_, p.c_str(), H5P_DEFAULT) > 0)
        attribute_on(file_, p, "units", units, path_);
    }
  }

  void start_field(const std::string& field, const stream2::Value& v) {
    const auto slash = field.find('/');
    const std::string top = field.substr(0, slash);
    using K = stream2::Value::Kind;
    if (top == "pixel_mask" && slash != std::string::npos) {
      const std::string channel = field.substr(slash + 1);
      write_value(file_, specific_ + "/pixel_mask_" + channel, v, path_);
      if (facts_.first_mask.empty() && v.kind == K::array && v.array.dims.size() == 2) {
        facts_.first_mask = channel;
        write_value(file_, specific_ + "/pixel_mask", v, path_);
        write_value(file_, std::string(kDetector) + "/pixel_mask", v, path_);
      }
      return;
    }
    write_value(file_, specific_ + "/" + field, v, path_);
    const auto nx = nx_names().find(top);
    if (nx != nx_names().end() && top != "pixel_mask" &&
        (slash == std::string::npos) == (top != "threshold_energy")) {
      const std::string at = std::string(kDetector) + "/" + nx->second.name;
      write_value(file_, at, v, path_);  // the first channel's, for a per-channel field
      if (nx->second.units) attribute_on(file_, at, "units", nx->second.units, path_);
    }
    if (const auto x = numeric(v)) facts_.number.emplace(field, *x);
    if (field == "arm_date" && v.kind == K::text) facts_.arm_date = std::string(v.s);
    if (field == "image_dtype" && v.kind == K::text) facts_.image_dtype = std::string(v.s);
    if (field == "detector_translation" && v.kind == K::reals) facts_.translation = v.reals;
    if (field == "channels" && v.kind == K::texts)
      facts_.channels.assign(v.texts.begin(), v.texts.end());
    if (top == "goniometer") {
      const auto second = field.find('/', slash + 1);
      const auto x = numeric(v);
      if (second != std::string::npos && x) {
        auto& axis = facts_.goniometer[field.substr(slash + 1, second - slash - 1)];
        const std::string what = field.substr(second + 1);
        if (what == "start") axis.start = *x;
        if (what == "increment") axis.increment = *x;
      }
    }
  }

  // /entry: what NXmx asks of it.
  void entry() {
    text_field(file_, "/entry/definition", "NXmx", path_);
    attribute_on(file_, "/entry/definition", "version", "1.0", path_);
    hid_t entry = H5Gopen2(file_, "/entry", H5P_DEFAULT);
    text_attribute(entry, "default", "data", path_);
    u64_attribute(entry, "series_id", m_.series_id, path_);
    text_attribute(entry, "series_unique_id", m_.series_unique_id, path_);
    if (!m_.incomplete.empty()) text_attribute(entry, "incomplete", m_.incomplete, path_);
    H5Gclose(entry);
    const std::string start_time = facts_.arm_date.value_or(m_.start_time);
    text_field(file_, "/entry/start_time", start_time, path_);
    std::string estimated = start_time;
    const auto images = number("number_of_images");
    if (const auto t0 = parse_time(start_time); t0 && images) {
      estimated = format_time(
          *t0 + *images * number("frame_time").value_or(number("count_time").value_or(0)));
    }
    text_field(file_, "/entry/end_time_estimated", estimated, path_);
    if (!m_.end_time.empty()) text_field(file_, "/entry/end_time", m_.end_time, path_);
  }

  // /entry/data: a link to every data file the series will have (dangling until it is written),
  // as DECTRIS's file writer links them (what XDS's readers open).
  void data_links() {
    hid_t data = H5Gopen2(file_, "/entry/data", H5P_DEFAULT);
    text_attribute(data, "signal", "data", path_);
    if (count_ > 0 && m_.frames_per_file > 0) {
      const std::uint64_t files = (count_ + m_.frames_per_file - 1) / m_.frames_per_file;
      for (std::uint64_t k = 1; k <= files; ++k) {
        char suffix[16];
        std::snprintf(suffix, sizeof(suffix), "_%06llu", static_cast<unsigned long long>(k));
        const std::string target = data_file_name(m_.data_prefix, k);
        bool ok = H5Lcreate_external(target.c_str(), "/entry/data/data", data,
                                     (std::string("data") + suffix).c_str(), H5P_DEFAULT,
                                     H5P_DEFAULT) >= 0;
        for (const auto& c : facts_.channels) {
          if (!ok) break;
          ok = H5Lcreate_external(target.c_str(), ("/entry/data/" + c).c_str(), data,
                                  (c + suffix).c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0;
        }
        if (!ok) {
          H5Gclose(data);
          fail(path_, "link data file " + target);
        }
      }
    }
    H5Gclose(data);
  }

  // The virtual datasets over the data files (what NXdata's signal names: DIALS, silx and h5py
  // read the series as one stack), and each image's start, stop and real time.
  void stacks() {
    const bool stackable = count_ > 0 && m_.frames_per_file > 0 && rows_ && cols_ &&
                           (facts_.image_dtype == "uint8" || facts_.image_dtype == "uint16" ||
                            facts_.image_dtype == "uint32");
    if (!stackable) return;
    std::vector<std::string> stacks = {"data"};
    for (const auto& c : facts_.channels) {
      if (c != "data") stacks.push_back(c);
    }
    // The data files an unfinished series left as .part: what each of their datasets holds.
    const auto slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : path_.substr(0, slash + 1);
    std::vector<std::string> sources;
    sources.reserve(stacks.size());
    for (const auto& name : stacks) sources.push_back("/entry/data/" + name);
    for (const char* t : kImageTimes) sources.push_back(std::string(kDetector) + "/" + t);
    std::map<std::uint64_t, std::map<std::string, hsize_t>> unfinished;
    for (const auto k : m_.unfinished)
      unfinished[k] = extents_of(dir + data_file_name(m_.data_prefix, k) + ".part", sources);
    const std::uint64_t fill = no_data(facts_.image_dtype);
    hid_t type = file_type(facts_.image_dtype);
    for (const auto& name : stacks) {
      const std::string at = "/entry/data/" + name;
      const Mapping stack{at,
                          {static_cast<hsize_t>(*rows_), static_cast<hsize_t>(*cols_)},
                          type,
                          H5T_NATIVE_UINT64,
                          &fill};
      virtual_over_files(file_, at, count_, stack, m_, unfinished, path_);
      attribute_on(file_, at, "interpretation", "image", path_);
    }
    // Each image's start, stop and real time (seconds from the series' date) as the data files
    // hold them from the image messages, when the first data file has them (NaN where an image
    // has not come).
    const std::string first_file = dir + data_file_name(m_.data_prefix, 1);
    const auto present =
        extents_of(path_exists(first_file) ? first_file : first_file + ".part", sources);
    const double nan = std::nan("");
    for (const char* t : kImageTimes) {
      const std::string at = std::string(kDetector) + "/" + t;
      if (!present.count(at)) continue;
      virtual_over_files(file_, at, count_,
                         Mapping{at, {}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &nan}, m_, unfinished,
                         path_);
      attribute_on(file_, at, "units", "s", path_);
    }
  }

  // The instrument, the beam, the source.
  void instrument() {
    text_field(file_, "/entry/instrument/name", m_.instrument.empty() ? "unknown" : m_.instrument,
               path_);
    text_field(file_, "/entry/source/name", m_.source.empty() ? "unknown" : m_.source, path_);
    text_field(file_, "/entry/sample/name", m_.sample.empty() ? "unknown" : m_.sample, path_);
    std::optional<double> wavelength = number("incident_wavelength");
    if (!wavelength && number("incident_energy") && *number("incident_energy") > 0) {
      wavelength = 12398.4198 / *number("incident_energy");  // hc in eV * angstrom
    }
    if (wavelength) {
      scalar_f64(file_, "/entry/instrument/beam/incident_wavelength", *wavelength, "angstrom",
                 path_);
    }
  }

  // The sample: the goniometer's axes (kAxes) the start message gives, as a chain of rotations
  // with an angle per image (start + i x increment) when one of them turns, so a rotation series
  // is one sweep; a series where none turns is a series of stills (depends_on ".").
  void sample() {
    std::string depends_on = ".";
    const bool turns =
        std::any_of(facts_.goniometer.begin(), facts_.goniometer.end(),
                    [](const auto& a) { return a.second.increment.value_or(0) != 0; });
    if (turns && count_ > 0) {
      const std::string tr = "/entry/sample/transformations";
      group(file_, tr, "NXtransformations", path_);
      for (auto a = std::rbegin(kAxes); a != std::rend(kAxes); ++a) {  // outermost first
        const auto it = facts_.goniometer.find(a->name);
        if (it == facts_.goniometer.end()) continue;
        const std::string at = tr + "/" + a->name;
        rotation(at, *a, it->second, depends_on);
        depends_on = at;
      }
    }
    text_field(file_, "/entry/sample/depends_on", depends_on, path_);
  }

  // One goniometer axis at `at`: its angle at each image and where each image's turn ends.
  void rotation(const std::string& at, const KnownAxis& a, const StartFacts::Axis& given,
                const std::string& depends_on) {
    const double zero[3] = {0, 0, 0};
    const double start = given.start.value_or(0), step = given.increment.value_or(0);
    std::vector<double> angles(count_), ends(count_);
    for (std::uint64_t i = 0; i < count_; ++i) {
      angles[i] = start + static_cast<double>(i) * step;
      ends[i] = angles[i] + step;
    }
    f64_array(file_, at, angles, path_);
    hid_t d = H5Dopen2(file_, at.c_str(), H5P_DEFAULT);
    text_attribute(d, "units", "deg", path_);
    text_attribute(d, "transformation_type", "rotation", path_);
    vector_attribute(d, "vector", a.vector, path_);
    vector_attribute(d, "offset", zero, path_);
    text_attribute(d, "offset_units", "m", path_);
    text_attribute(d, "depends_on", depends_on, path_);
    H5Dclose(d);
    f64_array(file_, at + "_end", ends, path_);
    attribute_on(file_, at + "_end", "units", "deg", path_);
    scalar_f64(file_, at + "_increment_set", step, "deg", path_);
  }

  // The detector in NXmx's names and geometry: where it is (detector_translation).
  void detector() {
    const std::string det = kDetector;
    for (const auto& [name, v] : {std::pair{"x_pixel_size", number("pixel_size_x")},
                                  std::pair{"y_pixel_size", number("pixel_size_y")}}) {
      if (!v) continue;
      scalar_f64(file_, det + "/" + name, *v, "m", path_);
      if (!m_.start.empty()) scalar_f64(file_, specific_ + "/" + name, *v, "m", path_);
    }
    group(file_, det + "/transformations", "NXtransformations", path_);
    double t[3] = {0, 0, 0};
    if (facts_.translation.size() == 3)
      std::copy(facts_.translation.begin(), facts_.translation.end(), t);
    const double length = std::sqrt(t[0] * t[0] + t[1] * t[1] + t[2] * t[2]);
    const double along[3] = {length > 0 ? t[0] / length : 0, length > 0 ? t[1] / length : 0,
                             length > 0 ? t[2] / length : 1};
    const double zero[3] = {0, 0, 0};
    translation_ = det + "/transformations/translation";
    axis(file_, translation_, length, "m", along, zero, ".", path_);
    text_field(file_, det + "/depends_on", translation_, path_);
    if (facts_.translation.size() == 3) scalar_f64(file_, det + "/distance", length, "m", path_);
    if (!facts_.image_dtype.empty()) {
      for (const char* name : {"bit_depth_image", "bit_depth_readout"}) {
        scalar_u64(file_, det + "/" + name, static_cast<std::uint64_t>(bits_of(facts_.image_dtype)),
                   path_);
      }
    }
  }

  // What XDS's readers (Neggia, Durin) take from DECTRIS's detectorSpecific. Neggia refuses a
  // master without a pixel mask: a start message without one gets a mask of no pixel masked
  // (uint8 zeros), which says so.
  void detector_specific() {
    if (m_.start.empty()) return;
    if (facts_.first_mask.empty() && rows_ && cols_) {
      const hsize_t dims[2] = {static_cast<hsize_t>(*rows_), static_cast<hsize_t>(*cols_)};
      const std::vector<std::uint8_t> none(dims[0] * dims[1], 0);
      hid_t space = H5Screate_simple(2, dims, nullptr);
      for (const std::string& at :
           {std::string(kDetector) + "/pixel_mask", specific_ + "/pixel_mask"}) {
        dataset(file_, at, H5T_STD_U8LE, H5T_NATIVE_UINT8, space, none.data(), path_);
        attribute_on(file_, at, "description",
                     "the start message carried no pixel mask: no pixel is masked", path_);
      }
      H5Sclose(space);
    }
    if (count_ > 0) scalar_u64(file_, specific_ + "/nimages", count_, path_);
    scalar_u64(file_, specific_ + "/ntrigger", 1, path_);
    if (rows_ && cols_) {
      scalar_u64(file_, specific_ + "/x_pixels_in_detector", static_cast<std::uint64_t>(*cols_),
                 path_);
      scalar_u64(file_, specific_ + "/y_pixels_in_detector", static_cast<std::uint64_t>(*rows_),
                 path_);
    }
  }

  // Where the pixels are: the beam centre on the beam axis, fast pixels along -x, slow along -y.
  void module() {
    const auto px = number("pixel_size_x"), py = number("pixel_size_y");
    if (!rows_ || !cols_ || !px || !py) return;
    const std::string module = std::string(kDetector) + "/module";
    group(file_, module, "NXdetector_module", path_);
    int_pair(file_, module + "/data_origin", 0, 0, path_);
    int_pair(file_, module + "/data_size", static_cast<std::int64_t>(*rows_),
             static_cast<std::int64_t>(*cols_), path_);
    const double bx = number("beam_center_x").value_or(0) * *px,
                 by = number("beam_center_y").value_or(0) * *py;
    const double offset_length = std::sqrt(bx * bx + by * by);
    const double offset_along[3] = {offset_length > 0 ? bx / offset_length : 1,
                                    offset_length > 0 ? by / offset_length : 0, 0};
    const double zero[3] = {0, 0, 0};
    axis(file_, module + "/module_offset", offset_length, "m", offset_along, zero, translation_,
         path_);
    const double fast[3] = {-1, 0, 0}, slow[3] = {0, -1, 0};
    axis(file_, module + "/fast_pixel_direction", *px, "m", fast, zero, module + "/module_offset",
         path_);
    axis(file_, module + "/slow_pixel_direction", *py, "m", slow, zero, module + "/module_offset",
         path_);
  }

  // What a restarted gateway reads back (read_master).
  void own_record() {
    hid_t g = H5Gopen2(file_, kNumastream, H5P_DEFAULT);
    u64_attribute(g, "stream_id", m_.stream_id, path_);
    u64_attribute(g, "frames_per_file", m_.frames_per_file, path_);
    text_attribute(g, "data_prefix", m_.data_prefix, path_);
    text_attribute(g, "gateway_start_time", m_.start_time, path_);
    text_attribute(g, "instrument", m_.instrument, path_);
    text_attribute(g, "source", m_.source, path_);
    text_attribute(g, "sample", m_.sample, path_);
    if (m_.start_sequence) u64_attribute(g, "start_sequence", *m_.start_sequence, path_);
    if (m_.end_sequence) u64_attribute(g, "end_sequence", *m_.end_sequence, path_);
    H5Gclose(g);
  }

  hid_t file_;
  const std::string& path_;
  const NxmxMaster& m_;
  const std::string specific_;  // the detector's detectorSpecific
  StartFacts facts_;
  std::uint64_t count_ = 0;  // the series' images (number_of_images)
  std::optional<double> rows_, cols_;
  std::string translation_;  // the detector's place, which its module depends on
};

}  // namespace

namespace detail {
void write_master_body(hid_t file, const std::string& path, const NxmxMaster& m) {
  MasterBody(file, path, m).write();
}
}  // namespace detail

}  // namespace numastream::hdf5
