// errors.h is header-only; this file keeps the core library non-empty before other sources land.
#include "common/errors.h"
