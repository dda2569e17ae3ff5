// The master file of an NXmx series (NeXus's application definition for macromolecular
// crystallography, what DIALS, XDS's readers and DECTRIS's own files follow): the series'
// metadata and links to its data files, each of at most frames_per_file images
// (<prefix>_data_000001.h5, ... : SeriesFile data parts):
//   /                             @default "entry"
//   /entry                        NXentry (@default "data"): definition "NXmx", start_time,
//                                 end_time_estimated, end_time once the series is complete;
//                                 attributes series_id, series_unique_id, incomplete (what it
//                                 lacks, when given up)
//   /entry/data                   NXdata (@signal "data"): data, and <channel> for each channel:
//                                 virtual datasets of number_of_images images over the data files
//                                 (an image no published data file holds reads as no data, every
//                                 bit set; a given-up series maps the images its .part files
//                                 hold); data_000001, ... external links to each data file's
//                                 /entry/data/data (the first channel), <channel>_000001, ... to
//                                 each channel
//   /entry/instrument             NXinstrument: name
//   /entry/instrument/detector    NXdetector: the start message's fields in NXmx's names, with
//                                 units; x/y_pixel_size, distance, bit_depth_image/readout,
//                                 pixel_mask (the first channel's); start_time, stop_time,
//                                 real_time: virtual datasets of each image's times over the data
//                                 files' (when they hold them); depends_on and
//                                 transformations/translation (detector_translation); module
//                                 (NXdetector_module): data_origin, data_size, module_offset (the
//                                 beam centre), fast and slow pixel directions (-x, -y: a detector
//                                 facing the beam); detectorSpecific: every start field as sent
//                                 (pixel masks as pixel_mask_<channel>, the first also pixel_mask)
//                                 and what XDS's readers take from DECTRIS's files (nimages,
//                                 ntrigger, x/y_pixels_in_detector, x/y_pixel_size); the start
//                                 message itself (stream2_start)
//   /entry/instrument/beam        NXbeam: incident_wavelength (or from incident_energy)
//   /entry/sample                 NXsample: name; depends_on the goniometer's chain
//                                 (transformations/phi -> chi -> omega, an angle per image from
//                                 the start message's goniometer start and increment, with
//                                 <axis>_end and <axis>_increment_set) when an axis turns, "."
//                                 for a series of stills
//   /entry/source                 NXsource: name
//   /entry/numastream             NXcollection: stream_id, start_sequence, end_sequence,
//                                 frames_per_file: what lets a restarted gateway go on
// The master is written whole each time it changes (a new file renamed over the old), never
// left open: a reader that has it open keeps a consistent file. Links to data files not yet
// written dangle until they are.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace numastream::hdf5 {

struct NxmxMaster {
  std::uint64_t series_id = 0;
  std::string series_unique_id;
  std::uint32_t stream_id = 0;
  std::vector<std::byte> start;  // the start message; empty until it came
  std::optional<std::uint64_t> start_sequence, end_sequence;
  std::uint64_t frames_per_file = 1000;
  std::string
      data_prefix;  // data file k is <data_prefix>_data_<k, 6 digits>.h5 (a name beside the master)
  std::string instrument, source, sample;  // NXmx names the detector does not send
  std::string start_time;  // ISO 8601 UTC: the start message's arm_date, else the gateway's clock
  std::string end_time;    // the gateway's clock when the series was complete; "" until then
  std::string incomplete;  // what a given-up series lacks; "" otherwise
  std::set<std::uint64_t> unfinished;  // data files a given-up series left as .part, by number
};

// The data file holding image `image_id` (from 1) and its name.
inline std::uint64_t data_file_of(std::uint64_t image_id, std::uint64_t frames_per_file) {
  return image_id / frames_per_file + 1;
}
std::string data_file_name(const std::string& prefix, std::uint64_t k);

// Writes `m` to `path` (through <path>.tmp, renamed over it). Throws naming the file.
void write_master(const std::string& path, const NxmxMaster& m);
// A master file read back (what write_master wrote); nullopt when it is not one.
std::optional<NxmxMaster> read_master(const std::string& path);

}  // namespace numastream::hdf5
