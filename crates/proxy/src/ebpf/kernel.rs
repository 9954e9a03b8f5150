//! eBPF mode in the kernel: loads the socket programs (built from `crates/ebpf-programs` into
//! this binary), pins their maps and links under a bpffs directory, attaches them to a cgroup v2
//! directory, and writes map updates. Pinned, they outlive the process: `proxy --once` leaves a
//! working node, and a restarted proxy adopts the maps (reads them back) and swaps in its own
//! programs without a moment with none attached.

use std::fs::File;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::programs::links::{CgroupAttachMode, FdLink, PinnedLink};
use aya::programs::{CgroupSockAddr, ProgramError};
use aya::{Ebpf, EbpfLoader};
use roadkeeper_ebpf_common::{Address, SOCKET_PROGRAMS, ServiceKey, ServiceValue, names};
use roadkeeper_rules::config::EbpfConfig;
use roadkeeper_rules::ebpf::{MapLimits, MapOp, Maps};

use super::wire;
use crate::Error;

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
}

impl Placement {
    /// Where `cfg` places eBPF mode: its `--cgroup-root`, else the root of the node's cgroup v2
    /// hierarchy (`/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on a hybrid one);
    /// the pins in `--bpf-root`'s `roadkeeper/`.
    pub fn of(cfg: &EbpfConfig) -> Result<Placement, Error> {
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
        Ok(Placement { cgroup, pin_dir: cfg.pin_dir() })
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
fn ebpf_error(what: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Error {
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
}

/// The loaded programs and their maps on one node.
pub struct EbpfKernel {
    ebpf: Ebpf,
    placement: Placement,
}

impl EbpfKernel {
    /// Loads the programs with maps sized by `limits` (pinned maps already there are adopted),
    /// and attaches them to `placement.cgroup`, replacing the links a previous run pinned. A
    /// verifier refusal names the program and carries the kernel's log.
    pub fn open(placement: &Placement, limits: &MapLimits) -> Result<EbpfKernel, Error> {
        require_fs(
            &placement.cgroup,
            CGROUP2_SUPER_MAGIC,
            "--cgroup-root",
            "a cgroup v2 directory: mount -t cgroup2 none DIR",
        )?;
        // Checked before anything is created there.
        let bpffs = placement.pin_dir.parent().unwrap_or(&placement.pin_dir);
        require_fs(bpffs, BPF_FS_MAGIC, "--bpf-root", "a bpffs mount: mount -t bpf bpf DIR")?;
        let (maps_dir, links_dir) = (placement.pin_dir.join("maps"), placement.pin_dir.join("links"));
        for dir in [&maps_dir, &links_dir] {
            std::fs::create_dir_all(dir).map_err(|err| ebpf_error(format!("creating {}", dir.display()), err))?;
        }
        let size = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&maps_dir)
            .map_max_entries(names::SERVICES, size(limits.services))
            .map_max_entries(names::BACKENDS, size(limits.backends))
            .map_max_entries(names::REV_NAT, size(limits.frontends))
            .load(OBJECT)
            .map_err(|err| ebpf_error("loading the BPF object (its maps)", err))?;
        let cgroup = File::open(&placement.cgroup)
            .map_err(|err| ebpf_error(format!("opening --cgroup-root {}", placement.cgroup.display()), err))?;
        for name in SOCKET_PROGRAMS {
            attach(&mut ebpf, name, &cgroup, &links_dir)?;
        }
        Ok(EbpfKernel { ebpf, placement: placement.clone() })
    }

    /// What the maps hold, as the planner lays it out (entries it cannot read are left out,
    /// for a full sync to delete).
    pub fn read(&self) -> Result<Maps, Error> {
        let mut maps = Maps::default();
        let services = self.map::<ServiceKey, ServiceValue>(names::SERVICES)?;
        for entry in services.iter() {
            let (key, value) = entry.map_err(|err| ebpf_error("reading the services map", err))?;
            if let Some((slot, value)) = wire::slot(&key, &value) {
                maps.services.insert(slot, value);
            }
        }
        let backends = self.map::<u32, Address>(names::BACKENDS)?;
        for entry in backends.iter() {
            let (id, address) = entry.map_err(|err| ebpf_error("reading the backends map", err))?;
            maps.backends.insert(id, wire::socket_addr(&address));
        }
        let rev_nat = self.map::<u16, Address>(names::REV_NAT)?;
        for entry in rev_nat.iter() {
            let (id, address) = entry.map_err(|err| ebpf_error("reading the reverse map", err))?;
            let at = wire::socket_addr(&address);
            maps.rev_nat.insert(id, (at.ip(), at.port()));
        }
        Ok(maps)
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
            // Read only by the programs on the node's interfaces, which this build does not
            // have yet: the planner keeps them, no map holds them.
            MapOp::SetMaglev(..)
            | MapOp::DeleteMaglev(_)
            | MapOp::AddSourceRange(..)
            | MapOp::DeleteSourceRange(..) => Ok(()),
        }
    }

    /// Whether every program is still attached (its pinned link is in place).
    pub fn in_place(&self) -> bool {
        let links = self.placement.pin_dir.join("links");
        SOCKET_PROGRAMS.iter().all(|name| links.join(name).exists())
    }

    fn map<K: aya::Pod, V: aya::Pod>(&self, name: &str) -> Result<BpfHashMap<&MapData, K, V>, Error> {
        let map = self.ebpf.map(name).ok_or_else(|| Error::EbpfSetup(format!("the BPF object has no map {name}")))?;
        BpfHashMap::try_from(map).map_err(|err| ebpf_error(format!("map {name}"), err))
    }

    fn map_mut<K: aya::Pod, V: aya::Pod>(&mut self, name: &str) -> Result<BpfHashMap<&mut MapData, K, V>, Error> {
        let map =
            self.ebpf.map_mut(name).ok_or_else(|| Error::EbpfSetup(format!("the BPF object has no map {name}")))?;
        BpfHashMap::try_from(map).map_err(|err| ebpf_error(format!("map {name}"), err))
    }
}

/// Loads program `name`, attaches it to `cgroup` beside what is there, pins the new link, then
/// unpins (and so detaches) the link a previous run pinned: the cgroup is never without one.
/// (bpffs refuses names with a dot.)
fn attach(ebpf: &mut Ebpf, name: &str, cgroup: &File, links_dir: &Path) -> Result<(), Error> {
    let program: &mut CgroupSockAddr = ebpf
        .program_mut(name)
        .ok_or_else(|| Error::EbpfSetup(format!("the BPF object has no program {name}")))?
        .try_into()
        .map_err(|err| ebpf_error(format!("program {name}"), err))?;
    program.load().map_err(|err| match err {
        ProgramError::LoadError { io_error, verifier_log } => Error::EbpfSetup(format!(
            "the kernel refused program {name} ({io_error}); eBPF mode needs kernel 5.18+ with BPF and cgroup v2 \
             (nftables and iptables modes work without); verifier log:\n{verifier_log}"
        )),
        other => ebpf_error(format!("loading program {name}"), other),
    })?;
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

/// Removes eBPF mode from a node: unpins every link (detaching the programs) and map under
/// `pin_dir`, then the directory. Nothing there: nothing to do. The number of objects removed.
pub fn cleanup(pin_dir: &Path) -> Result<usize, Error> {
    let mut removed = 0;
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
