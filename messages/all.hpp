// Every message family and the type-ID block, for code that handles many families (actors,
// codecs, tests).
#pragma once

#include "messages/control.hpp"
#include "messages/generate.hpp"
#include "messages/runner.hpp"
#include "messages/tensor.hpp"
#include "messages/type_ids.hpp"
#include "messages/weight_update.hpp"
