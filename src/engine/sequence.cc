#include "engine/sequence.h"

#include "engine/text/stream_detokenizer.h"

namespace agentkv::engine {

Sequence::Sequence() = default;
Sequence::~Sequence() = default;

}  // namespace agentkv::engine
