// The agent's log: one line per event on stderr, "<UTC time> <LEVEL> numastream-agent: <text>".
#pragma once

#include <string>

namespace numastream {

enum class LogLevel { info, warn, error };

// Now, UTC, ISO 8601 with milliseconds ("2026-11-28T01:24:47.123Z").
std::string utc_now();

// Writes one line (thread-safe: one write per line) and flushes.
void log_at(LogLevel level, const std::string& msg);

// What happened as planned.
inline void log_info(const std::string& msg) { log_at(LogLevel::info, msg); }
// Something a person should look at: data refused, late or missing, a placement not as planned.
inline void log_warn(const std::string& msg) { log_at(LogLevel::warn, msg); }
// The agent (or a stage) cannot go on.
inline void log_error(const std::string& msg) { log_at(LogLevel::error, msg); }

}  // namespace numastream
