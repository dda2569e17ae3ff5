#include "wire/stream_names.hpp"

#include <nlohmann/json.hpp>

namespace numastream {

std::string origin_name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.size() > kMaxOriginName)
    return "is " + std::to_string(name.size()) + " characters long (at most " +
           std::to_string(kMaxOriginName) + ")";
  if (name.front() == '.') return "starts with a dot";
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return "has a character other than letters, digits, '.', '_' and '-'";
  }
  if (name.find("..") != std::string_view::npos) return "has \"..\"";
  return {};
}

std::optional<std::string> origin_of_metadata(std::span<const std::byte> payload) {
  auto doc = nlohmann::json::parse(reinterpret_cast<const char*>(payload.data()),
                                   reinterpret_cast<const char*>(payload.data()) + payload.size(),
                                   nullptr, false);
  if (!doc.is_object() || !doc.contains("origin")) return std::nullopt;
  const auto& v = doc["origin"];
  if (doc.size() != 1 || !v.is_string() || !origin_name_problem(v.get<std::string>()).empty())
    return std::string();
  return v.get<std::string>();
}

std::string origin_metadata(const std::string& origin) {
  return nlohmann::json{{"origin", origin}}.dump();
}

StreamNames::Bound StreamNames::local(const std::string& origin, std::uint32_t stream) {
  std::lock_guard lock(mu_);
  const auto key = std::pair{origin, stream};
  if (auto it = local_.find(key); it != local_.end()) return {it->second};
  const Name name{origin, stream};
  if (local_.size() >= max_names_) {
    refusal_ = "more than " + std::to_string(max_names_) + " streams named";
    return {0, wire::DecodeError::too_many_streams};
  }
  std::vector<std::string> paths;
  for (const auto& p : patterns_) {
    paths.push_back(stream_path(p, name));
    auto held = path_origin_.find(paths.back());
    if (held != path_origin_.end() && held->second != origin) {
      refusal_ = "its output " + paths.back() + " holds a stream of " +
                 (held->second.empty() ? "a sender that named no origin" : held->second) +
                 " (put {origin} in sink.path to keep pipelines apart)";
      return {0, wire::DecodeError::contradicts_stream};
    }
  }
  for (auto& p : paths) path_origin_.emplace(std::move(p), origin);
  std::uint32_t id = stream;
  if (name_.count(id)) {
    // At most max_names_ ids are bound: this ends.
    while (name_.count(next_)) --next_;
    id = next_--;
  }
  local_.emplace(key, id);
  name_.emplace(id, name);
  return {id};
}

StreamNames::Name StreamNames::of(std::uint32_t local) const {
  std::lock_guard lock(mu_);
  auto it = name_.find(local);
  return it == name_.end() ? Name{{}, local} : it->second;
}

bool StreamNames::same_path(const std::string& pattern, std::uint32_t a, std::uint32_t b) const {
  return stream_path(pattern, of(a)) == stream_path(pattern, of(b));
}

std::string StreamNames::describe(std::uint32_t local) const {
  const Name n = of(local);
  return "stream " + std::to_string(n.stream) + (n.origin.empty() ? "" : " of " + n.origin);
}

std::string StreamNames::last_refusal() const {
  std::lock_guard lock(mu_);
  return refusal_;
}

std::string stream_path(const std::string& pattern, const StreamNames::Name& name) {
  std::string out = pattern;
  if (auto pos = out.find("{origin}"); pos != std::string::npos)
    out.replace(pos, 8, name.origin.empty() ? "default" : name.origin);
  if (auto pos = out.find("{stream}"); pos != std::string::npos)
    out.replace(pos, 8, std::to_string(name.stream));
  return out;
}

}  // namespace numastream
