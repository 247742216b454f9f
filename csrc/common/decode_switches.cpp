#include "common/decode_switches.h"

namespace ds4 {

DecodeSwitches& decode_switches() {
    static DecodeSwitches s;
    return s;
}

}  // namespace ds4
