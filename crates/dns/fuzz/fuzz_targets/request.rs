//! One DNS request over UDP, as bytes, through the whole request path of the server (parse,
//! answer from the zone, encode): no panic, and a response that parses back whole (no byte after
//! its last record), answers the request's ID and fits the size allowed (512 bytes without EDNS).
//! See `roadkeeper_dns::wire`.

#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use roadkeeper_dns::answer::Zones;
use roadkeeper_dns::wire;
use roadkeeper_dns::zone::ZoneData;

static FIXTURE: LazyLock<(Zones, ZoneData)> = LazyLock::new(wire::fixture);

fuzz_target!(|data: &[u8]| {
    let (zones, zone_data) = &*FIXTURE;
    wire::respond_checked(zones, zone_data, data);
});
