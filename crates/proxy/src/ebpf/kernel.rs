//! eBPF mode in the kernel: loads the programs (built from `crates/ebpf-programs` into this
//! binary), pins their maps and the socket programs' links under a bpffs directory, attaches
//! the socket programs to a cgroup v2 directory and the interface programs to the node's devices
//! (`super::interfaces`), applies the fixed netfilter table that masquerades and rejects what
//! they mark, and writes map updates. Pinned, they outlive the process: `proxy --once` leaves a
//! working node, and a restarted proxy adopts the maps (reads them back) and swaps in its own
//! programs without a moment with none attached.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{HashMap as BpfHashMap, Map, MapData, MapError};
use aya::programs::links::{CgroupAttachMode, FdLink, PinnedLink};
use aya::programs::{CgroupSockAddr, ProgramError};
use aya::{Ebpf, EbpfLoader};
use roadkeeper_ebpf_common::{
    Address, FLOW_FORWARD, FlowKey, FlowValue, MAGLEV_CHUNK, MaglevChunk, MaglevKey, SOCKET_PROGRAMS, ServiceKey,
    ServiceValue, SocketRevKey, SourceRangeKey, names, sizes,
};
use roadkeeper_rules::config::EbpfConfig;
use roadkeeper_rules::conntrack::ServingMap;
use roadkeeper_rules::ebpf::{MapLimits, MapOp, Maps, netfilter};

use super::{interfaces, sockets, wire};
use crate::Error;
use crate::tool;

/// The BPF object: `crates/ebpf-programs`, built for `bpfel-unknown-none` by `build.rs`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/roadkeeper-ebpf.o"));

/// `statfs` magic of a bpffs mount.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// `statfs` magic of a cgroup v2 mount.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Where eBPF mode lives on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The cgroup v2 directory whose sockets (and its descendants') are translated.
    pub cgroup: PathBuf,
    /// The bpffs directory that holds the pinned maps (`maps/`) and links (`links/`).
    pub pin_dir: PathBuf,
    /// The interfaces whose external traffic is translated.
    pub devices: Vec<String>,
}

impl Placement {
    /// Where `cfg` places eBPF mode: its `--cgroup-root`, else the root of the node's cgroup v2
    /// hierarchy (`/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on a hybrid one);
    /// the pins in `--bpf-root`'s `roadkeeper/`; the devices `--bpf-devices` lists, else those
    /// that hold `node_addresses`.
    pub fn of(cfg: &EbpfConfig, node_addresses: &[std::net::IpAddr]) -> Result<Placement, Error> {
        let cgroup = match &cfg.cgroup_root {
            Some(path) => path.clone(),
            None => DEFAULT_CGROUP_ROOTS
                .iter()
                .map(PathBuf::from)
                .find(|path| is_fs(path, CGROUP2_SUPER_MAGIC))
                .ok_or_else(|| {
                    Error::EbpfSetup(format!(
                        "no cgroup v2 hierarchy at {}: mount one (mkdir -p /run/roadkeeper/cgroupv2 && mount -t \
                         cgroup2 none /run/roadkeeper/cgroupv2), place the pods' processes in it and pass \
                         --cgroup-root",
                        DEFAULT_CGROUP_ROOTS.join(" or ")
                    ))
                })?,
        };
        let devices = if cfg.devices.is_empty() { interfaces::holding(node_addresses) } else { cfg.devices.clone() };
        // Checked before anything is attached.
        if let Some(missing) = devices.iter().find(|d| nix::net::if_::if_nametoindex(d.as_str()).is_err()) {
            return Err(Error::EbpfSetup(format!("--bpf-devices: interface {missing} does not exist")));
        }
        Ok(Placement { cgroup, pin_dir: cfg.pin_dir(), devices })
    }
}

/// Where a node's cgroup v2 hierarchy is mounted, unified first, then hybrid.
const DEFAULT_CGROUP_ROOTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// The `statfs` magic of the filesystem `path` is on.
fn fs_magic(path: &Path) -> nix::Result<i64> {
    nix::sys::statfs::statfs(path).map(|stat| stat.filesystem_type().0)
}

/// True when `path` is on a filesystem of `magic`.
fn is_fs(path: &Path, magic: i64) -> bool {
    fs_magic(path).is_ok_and(|found| found == magic)
}

/// An error of eBPF mode's kernel side, naming what failed.
pub(super) fn ebpf_error(what: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Ebpf { what: what.into(), source: Box::new(source) }
}

/// Fails unless `path` is a directory on a filesystem of `magic`.
fn require_fs(path: &Path, magic: i64, what: &str, how: &str) -> Result<(), Error> {
    let found =
        fs_magic(path).map_err(|err| ebpf_error(format!("{what} {}: cannot read it ({how})", path.display()), err))?;
    if found != magic {
        return Err(Error::EbpfSetup(format!("{what} {} is not one ({how})", path.display())));
    }
    Ok(())
}

impl super::proxier::EbpfRunner for EbpfKernel {
    fn read(&mut self) -> Result<Maps, Error> {
        EbpfKernel::read(self)
    }

    fn apply(&mut self, ops: &[MapOp]) -> Result<(), Error> {
        EbpfKernel::apply(self, ops)
    }

    fn in_place(&mut self) -> Result<bool, Error> {
        Ok(EbpfKernel::in_place(self))
    }

    fn repair(&mut self) -> Result<(), Error> {
        EbpfKernel::attach(self)
    }

    fn delete_stale_flows(&mut self, serving: &ServingMap) -> Result<u64, Error> {
        EbpfKernel::delete_stale_flows(self, serving)
    }
}

/// The oldest kernel eBPF mode is written for: its socket programs refuse `connect()` with
/// `bpf_set_retval` (5.18), and older kernels also refuse its Maglev map's large values.
const MIN_KERNEL: (u32, u32) = (5, 18);

/// `major.minor` of a kernel release (`uname -r`): `5.10.0-32-amd64` is (5, 10).
fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// What to add to a failure to load or attach when this kernel is older than [`MIN_KERNEL`]:
/// a kernel that backports what eBPF mode uses (it reports an older version) is still tried, so
/// the version is only named when something failed.
fn kernel_hint(release: &str) -> Option<String> {
    let version = release_version(release)?;
    (version < MIN_KERNEL).then(|| {
        format!(
            "this kernel is {}, older than the {}.{} eBPF mode needs; nftables, iptables and ipvs modes run on it",
            release.trim(),
            MIN_KERNEL.0,
            MIN_KERNEL.1
        )
    })
}

/// `err`, naming the kernel's version when that is the likely cause.
fn with_kernel_hint(err: Error) -> Error {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    match (err, kernel_hint(&release)) {
        (Error::Ebpf { what, source }, Some(hint)) => Error::Ebpf { what: format!("{what} ({hint})"), source },
        (err, _) => err,
    }
}

/// The loaded programs and their maps on one node.
pub struct EbpfKernel {
    ebpf: Ebpf,
    placement: Placement,
    /// Slots of each Maglev table.
    maglev_size: u32,
}

impl EbpfKernel {
    /// Loads the programs with maps sized by `limits` (pinned maps already there are adopted),
    /// and attaches them to `placement.cgroup`, replacing the links a previous run pinned. A
    /// verifier refusal names the program and carries the kernel's log.
    pub fn open(placement: &Placement, limits: &MapLimits) -> Result<EbpfKernel, Error> {
        EbpfKernel::load(placement, limits).map_err(with_kernel_hint)
    }

    fn load(placement: &Placement, limits: &MapLimits) -> Result<EbpfKernel, Error> {
        require_fs(
            &placement.cgroup,
            CGROUP2_SUPER_MAGIC,
            "--cgroup-root",
            "a cgroup v2 directory: mount -t cgroup2 none DIR",
        )?;
        // Checked before anything is created there.
        let bpffs = placement.pin_dir.parent().unwrap_or(&placement.pin_dir);
        require_fs(bpffs, BPF_FS_MAGIC, "--bpf-root", "a bpffs mount: mount -t bpf bpf DIR")?;
        let maps_dir = placement.pin_dir.join("maps");
        std::fs::create_dir_all(&maps_dir)
            .map_err(|err| ebpf_error(format!("creating {}", maps_dir.display()), err))?;
        let size = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let chunks = limits.maglev_table_size.div_ceil(MAGLEV_CHUNK as u32);
        let ebpf = EbpfLoader::new()
            .default_map_pin_directory(&maps_dir)
            .map_max_entries(names::SERVICES, size(limits.services))
            .map_max_entries(names::BACKENDS, size(limits.backends))
            .map_max_entries(names::REV_NAT, size(limits.frontends))
            .map_max_entries(names::MAGLEV, size(limits.frontends).saturating_mul(chunks).max(sizes::MAGLEV_CHUNKS))
            .map_max_entries(names::SOURCE_RANGES, size(limits.source_ranges))
            .override_global(names::MAGLEV_SIZE, &limits.maglev_table_size, true)
            .load(OBJECT)
            .map_err(|err| ebpf_error("loading the BPF object (its maps)", err))?;
        let mut kernel = EbpfKernel { ebpf, placement: placement.clone(), maglev_size: limits.maglev_table_size };
        kernel.attach()?;
        Ok(kernel)
    }

    /// Attaches every program (in place of what is attached) and applies the netfilter table:
    /// at start, and again when someone removed them.
    pub fn attach(&mut self) -> Result<(), Error> {
        let placement = &self.placement;
        let cgroup = File::open(&placement.cgroup)
            .map_err(|err| ebpf_error(format!("opening --cgroup-root {}", placement.cgroup.display()), err))?;
        let links_dir = placement.pin_dir.join("links");
        std::fs::create_dir_all(&links_dir)
            .map_err(|err| ebpf_error(format!("creating {}", links_dir.display()), err))?;
        for name in SOCKET_PROGRAMS {
            attach(&mut self.ebpf, name, &cgroup, &links_dir)?;
        }
        // Without devices no traffic is marked: the host keeps no table.
        if !placement.devices.is_empty() {
            apply_table()?;
        }
        interfaces::attach(&mut self.ebpf, &placement.devices, &placement.pin_dir)
    }

    /// What the maps hold, as the planner lays it out (entries it cannot read are left out,
    /// for a full sync to delete).
    pub fn read(&self) -> Result<Maps, Error> {
        read_maps(&|name| self.ebpf.map(name), self.maglev_size)
    }

    /// Applies map updates in order.
    pub fn apply(&mut self, ops: &[MapOp]) -> Result<(), Error> {
        ops.iter().try_for_each(|op| self.apply_one(op))
    }

    fn apply_one(&mut self, op: &MapOp) -> Result<(), Error> {
        let failed = |err: aya::maps::MapError| ebpf_error(format!("map update {op:?}"), err);
        match op {
            MapOp::SetBackend(id, at) => self
                .map_mut::<u32, Address>(names::BACKENDS)?
                .insert(id, wire::address(at.ip(), at.port()), 0)
                .map_err(failed),
            MapOp::DeleteBackend(id) => self.map_mut::<u32, Address>(names::BACKENDS)?.remove(id).map_err(failed),
            MapOp::SetRevNat(id, (ip, port)) => {
                self.map_mut::<u16, Address>(names::REV_NAT)?.insert(id, wire::address(*ip, *port), 0).map_err(failed)
            }
            MapOp::DeleteRevNat(id) => self.map_mut::<u16, Address>(names::REV_NAT)?.remove(id).map_err(failed),
            MapOp::SetSlot(key, value) => {
                let value = wire::service_value(value);
                self.map_mut::<ServiceKey, ServiceValue>(names::SERVICES)?
                    .insert(wire::service_key(key), value, 0)
                    .map_err(failed)
            }
            MapOp::DeleteSlot(key) => self
                .map_mut::<ServiceKey, ServiceValue>(names::SERVICES)?
                .remove(&wire::service_key(key))
                .map_err(failed),
            MapOp::SetMaglev(id, table) => {
                let mut map = self.map_mut::<MaglevKey, MaglevChunk>(names::MAGLEV)?;
                for (chunk, ids) in table.chunks(MAGLEV_CHUNK).enumerate() {
                    let mut value: MaglevChunk = [0; MAGLEV_CHUNK];
                    value[..ids.len()].copy_from_slice(ids);
                    let key = MaglevKey { frontend_id: *id, chunk: u16::try_from(chunk).unwrap_or(u16::MAX) };
                    map.insert(key, value, 0).map_err(failed)?;
                }
                Ok(())
            }
            MapOp::DeleteMaglev(id) => {
                let chunks = self.maglev_size.div_ceil(MAGLEV_CHUNK as u32);
                let mut map = self.map_mut::<MaglevKey, MaglevChunk>(names::MAGLEV)?;
                for chunk in 0..chunks {
                    let key = MaglevKey { frontend_id: *id, chunk: u16::try_from(chunk).unwrap_or(u16::MAX) };
                    absent_is_fine(map.remove(&key)).map_err(failed)?;
                }
                Ok(())
            }
            MapOp::AddSourceRange(id, net) => {
                let (bits, key) = wire::source_range_key(*id, net);
                self.source_ranges_mut()?.insert(&LpmKey::new(bits, key), 1u8, 0).map_err(failed)
            }
            MapOp::DeleteSourceRange(id, net) => {
                let (bits, key) = wire::source_range_key(*id, net);
                absent_is_fine(self.source_ranges_mut()?.remove(&LpmKey::new(bits, key))).map_err(failed)
            }
        }
    }

    /// Deletes the UDP/SCTP flows of external traffic held to a backend that `serving` says no
    /// longer serves their frontend (both entries of each: forward and reply), as the other
    /// modes delete such conntrack entries; the number of flows deleted. The programs keep a
    /// flow while its backend's identifier holds the same address, which another Service may
    /// still use.
    pub fn delete_stale_flows(&mut self, serving: &ServingMap) -> Result<u64, Error> {
        let mut flows = self.map_mut::<FlowKey, FlowValue>(names::FLOWS)?;
        // Bounded: keys deleted by the programs meanwhile can make the walk start over.
        let stale: Vec<(FlowKey, FlowValue)> = flows
            .iter()
            .take(2 * sizes::FLOWS as usize)
            .filter_map(Result::ok)
            .filter(|(key, value)| key.direction == FLOW_FORWARD && serving.is_stale(&wire::flow(key, value)))
            .collect();
        let failed = |err: MapError| ebpf_error(format!("deleting a stale flow from {}", names::FLOWS), err);
        for (key, value) in &stale {
            absent_is_fine(flows.remove(key)).map_err(failed)?;
            absent_is_fine(flows.remove(&wire::reply_key(key, value))).map_err(failed)?;
        }
        let sockets = self.stale_sockets(serving)?;
        Ok(stale.len() as u64 + sockets::destroy(&self.placement.cgroup, &sockets))
    }

    /// The cookies of the sockets the socket programs translated to an endpoint that no longer
    /// serves their frontend (UDP: `serving` holds no TCP frontend).
    fn stale_sockets(&mut self, serving: &ServingMap) -> Result<HashSet<u64>, Error> {
        let translated = self.map_mut::<SocketRevKey, Address>(names::SOCKET_REV)?;
        let udp = roadkeeper_rules::conntrack::IPPROTO_UDP;
        let pair = |address: &Address| {
            let at = wire::socket_addr(address);
            (at.ip(), at.port())
        };
        Ok(translated
            .iter()
            .take(2 * sizes::SOCKET_REV as usize)
            .filter_map(Result::ok)
            .filter(|(key, frontend)| serving.is_stale_endpoint(udp, pair(frontend), pair(&key.backend)))
            .map(|(key, _)| key.cookie)
            .collect())
    }

    fn source_ranges_mut(&mut self) -> Result<LpmTrie<&mut MapData, SourceRangeKey, u8>, Error> {
        let map = self.ebpf.map_mut(names::SOURCE_RANGES).ok_or_else(|| no_map(names::SOURCE_RANGES))?;
        LpmTrie::try_from(map).map_err(|err| ebpf_error(format!("map {}", names::SOURCE_RANGES), err))
    }

    /// Whether every program is still attached (its pinned link is in place).
    pub fn in_place(&self) -> bool {
        let links = self.placement.pin_dir.join("links");
        SOCKET_PROGRAMS.iter().all(|name| links.join(name).exists())
    }

    fn map_mut<K: aya::Pod, V: aya::Pod>(&mut self, name: &str) -> Result<BpfHashMap<&mut MapData, K, V>, Error> {
        let map = self.ebpf.map_mut(name).ok_or_else(|| no_map(name))?;
        BpfHashMap::try_from(map).map_err(|err| ebpf_error(format!("map {name}"), err))
    }
}

/// What the maps `find` gives hold, as the planner lays it out (entries it cannot read are left
/// out, for a full sync to delete); Maglev tables of `maglev_size` slots.
fn read_maps<'a>(find: &dyn Fn(&str) -> Option<&'a Map>, maglev_size: u32) -> Result<Maps, Error> {
    let mut maps = Maps::default();
    let services = hash_map::<ServiceKey, ServiceValue>(find, names::SERVICES)?;
    for entry in services.iter() {
        let (key, value) = entry.map_err(|err| ebpf_error("reading the services map", err))?;
        if let Some((slot, value)) = wire::slot(&key, &value) {
            maps.services.insert(slot, value);
        }
    }
    let backends = hash_map::<u32, Address>(find, names::BACKENDS)?;
    for entry in backends.iter() {
        let (id, address) = entry.map_err(|err| ebpf_error("reading the backends map", err))?;
        maps.backends.insert(id, wire::socket_addr(&address));
    }
    let rev_nat = hash_map::<u16, Address>(find, names::REV_NAT)?;
    for entry in rev_nat.iter() {
        let (id, address) = entry.map_err(|err| ebpf_error("reading the reverse map", err))?;
        let at = wire::socket_addr(&address);
        maps.rev_nat.insert(id, (at.ip(), at.port()));
    }
    let maglev = hash_map::<MaglevKey, MaglevChunk>(find, names::MAGLEV)?;
    for entry in maglev.iter() {
        let (key, chunk) = entry.map_err(|err| ebpf_error("reading the Maglev map", err))?;
        let table = maps.maglev.entry(key.frontend_id).or_insert_with(|| vec![0; maglev_size as usize]);
        let start = usize::from(key.chunk) * MAGLEV_CHUNK;
        for (slot, id) in table.iter_mut().skip(start).zip(chunk) {
            *slot = id;
        }
    }
    let map = find(names::SOURCE_RANGES).ok_or_else(|| no_map(names::SOURCE_RANGES))?;
    let ranges = LpmTrie::<_, SourceRangeKey, u8>::try_from(map)
        .map_err(|err| ebpf_error(format!("map {}", names::SOURCE_RANGES), err))?;
    for key in ranges.keys() {
        let key = key.map_err(|err| ebpf_error("reading the source ranges map", err))?;
        if let Some(range) = wire::source_range(key.prefix_len(), &key.data()) {
            maps.source_ranges.insert(range);
        }
    }
    Ok(maps)
}

/// Map `name` of those `find` gives, as a hash map.
fn hash_map<'a, K: aya::Pod, V: aya::Pod>(
    find: &dyn Fn(&str) -> Option<&'a Map>,
    name: &str,
) -> Result<BpfHashMap<&'a MapData, K, V>, Error> {
    let map = find(name).ok_or_else(|| no_map(name))?;
    BpfHashMap::try_from(map).map_err(|err| ebpf_error(format!("map {name}"), err))
}

/// What the maps pinned under `pin_dir` hold (`roadkeeper rules --from-kernel`), without
/// loading or attaching anything; Maglev tables of `maglev_size` slots.
pub fn read_pinned(pin_dir: &Path, maglev_size: u32) -> Result<Maps, Error> {
    let mut pinned = std::collections::BTreeMap::new();
    for name in [names::SERVICES, names::BACKENDS, names::REV_NAT, names::MAGLEV, names::SOURCE_RANGES] {
        let path = pin_dir.join("maps").join(name);
        let data = MapData::from_pin(&path).map_err(|err| ebpf_error(format!("opening {}", path.display()), err))?;
        let map = Map::from_map_data(data).map_err(|err| ebpf_error(format!("map {}", path.display()), err))?;
        pinned.insert(name, map);
    }
    read_maps(&|name| pinned.get(name), maglev_size)
}

/// The error of a map the object lacks.
fn no_map(name: &str) -> Error {
    Error::EbpfSetup(format!("the BPF object has no map {name}"))
}

/// A removal of an entry that is not there succeeds (a table shorter than the size, a range
/// someone removed).
fn absent_is_fine(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::KeyNotFound | MapError::ElementNotFound) => Ok(()),
        other => other,
    }
}

/// Replaces the netfilter table that masquerades and rejects what the interface programs mark.
fn apply_table() -> Result<(), Error> {
    let script = netfilter::script();
    tool::run("nft", &["-f", "-"], Some(&script)).map(drop).map_err(|err| {
        Error::EbpfSetup(format!(
            "eBPF mode masquerades external traffic with a fixed nftables table (inet {}), and nft failed: {err}",
            netfilter::TABLE
        ))
    })
}

/// Program `name` of the object, loaded (one loaded already, by an earlier attach, is fine): a
/// verifier refusal names the program and carries the kernel's log.
pub(super) fn loaded<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P, Error>
where
    P: ProgramLoad,
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let program: &mut P = ebpf
        .program_mut(name)
        .ok_or_else(|| Error::EbpfSetup(format!("the BPF object has no program {name}")))?
        .try_into()
        .map_err(|err| ebpf_error(format!("program {name}"), err))?;
    match program.load_program() {
        Ok(()) | Err(ProgramError::AlreadyLoaded) => Ok(program),
        Err(err) => Err(load_error(name, err)),
    }
}

/// The programs [`loaded`] loads.
pub(super) trait ProgramLoad {
    /// The program's own `load`.
    fn load_program(&mut self) -> Result<(), ProgramError>;
}

impl ProgramLoad for CgroupSockAddr {
    fn load_program(&mut self) -> Result<(), ProgramError> {
        self.load()
    }
}

impl ProgramLoad for aya::programs::SchedClassifier {
    fn load_program(&mut self) -> Result<(), ProgramError> {
        self.load()
    }
}

/// A program's load failure: a verifier refusal names the program and carries the kernel's log.
fn load_error(name: &str, err: ProgramError) -> Error {
    match err {
        ProgramError::LoadError { io_error, verifier_log } => Error::EbpfSetup(format!(
            "the kernel refused program {name} ({io_error}); eBPF mode needs kernel 5.18+ with BPF and cgroup v2 \
             (nftables and iptables modes work without); verifier log:\n{verifier_log}"
        )),
        other => ebpf_error(format!("loading program {name}"), other),
    }
}

/// Loads program `name`, attaches it to `cgroup` beside what is there, pins the new link, then
/// unpins (and so detaches) the link a previous run pinned: the cgroup is never without one.
/// (bpffs refuses names with a dot.)
fn attach(ebpf: &mut Ebpf, name: &str, cgroup: &File, links_dir: &Path) -> Result<(), Error> {
    let program: &mut CgroupSockAddr = loaded(ebpf, name)?;
    // A cgroup link takes no flags (the kernel refuses any) and sits beside the cgroup's other
    // links, as multi-attach would: aya's `Single` sends none.
    let link_id = program
        .attach(cgroup, CgroupAttachMode::Single)
        .map_err(|err| ebpf_error(format!("attaching program {name} to the cgroup"), err))?;
    let link = program.take_link(link_id).map_err(|err| ebpf_error(format!("program {name}'s link"), err))?;
    let link = FdLink::try_from(link).map_err(|err| ebpf_error(format!("program {name}'s link"), err))?;
    let (path, next) = (links_dir.join(name), links_dir.join(format!("{name}_next")));
    let _ = std::fs::remove_file(&next);
    let pinned = link.pin(&next).map_err(|err| ebpf_error(format!("pinning {}", next.display()), err))?;
    if path.exists() {
        let old = PinnedLink::from_pin(&path).map_err(|err| ebpf_error(format!("reading {}", path.display()), err))?;
        // Unpinned and dropped: the old program is detached.
        drop(old.unpin().map_err(|err| ebpf_error(format!("unpinning {}", path.display()), err))?);
    }
    std::fs::rename(&next, &path).map_err(|err| ebpf_error(format!("renaming {}", next.display()), err))?;
    // The link stays attached through its pin.
    drop(pinned);
    Ok(())
}

/// Removes eBPF mode from a node: detaches the interface programs from the devices recorded
/// there, unpins every link (detaching the socket programs) and map under `pin_dir`, removes the
/// directory and the netfilter table. Nothing there: nothing to do. The number of objects
/// removed.
pub fn cleanup(pin_dir: &Path) -> Result<usize, Error> {
    let mut removed = interfaces::detach_all(pin_dir)?;
    if tool::run("nft", &["list", "table", "inet", netfilter::TABLE], None).is_ok() {
        tool::run("nft", &["delete", "table", "inet", netfilter::TABLE], None)
            .map_err(|err| Error::EbpfSetup(format!("deleting table inet {}: {err}", netfilter::TABLE)))?;
        removed += 1;
    }
    for sub in ["links", "maps"] {
        let dir = pin_dir.join(sub);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            std::fs::remove_file(entry.path())
                .map_err(|err| ebpf_error(format!("unpinning {}", entry.path().display()), err))?;
            removed += 1;
        }
        let _ = std::fs::remove_dir(&dir);
    }
    let _ = std::fs::remove_dir(pin_dir);
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_older_than_ebpf_modes_kernel_is_named_and_a_newer_one_is_not() {
        assert_eq!(release_version("5.10.0-32-amd64\n"), Some((5, 10)));
        assert_eq!(release_version("6.18.1"), Some((6, 18)));
        assert_eq!(release_version("garbage"), None);
        let hint = kernel_hint("5.10.0-32-amd64\n").expect("5.10 is too old");
        assert!(hint.contains("5.10.0-32-amd64") && hint.contains("5.18") && hint.contains("nftables"), "{hint}");
        assert_eq!(kernel_hint("5.18.0"), None);
        assert_eq!(kernel_hint("6.1.0-57-amd64"), None);
        assert_eq!(kernel_hint(""), None, "an unreadable release adds nothing");
    }
}
