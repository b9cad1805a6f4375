#include "engine/sequence.h"

#include "engine/text/stream_detokenizer.h"

namespace agentkv {

Sequence::Sequence() = default;
Sequence::~Sequence() = default;

}  // namespace agentkv
