// A strict JSON syntax check (RFC 8259), so the fd listener tells a peer whose header is not
// a JSON object that it was refused instead of `ok` (the header is parsed later, in JS).
#pragma once

#include <string>

namespace vsnap::ipc {

// True when text is one JSON object (surrounding whitespace allowed), nested at most 64 deep.
bool isJsonObject(const std::string& text);

}  // namespace vsnap::ipc
