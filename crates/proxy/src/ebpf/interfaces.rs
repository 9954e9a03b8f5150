//! The programs on the node's interfaces: `rk_from_outside` on tc ingress and `rk_to_outside`
//! on tc egress of each device (`--bpf-devices`), attached as cls_bpf filters of a clsact qdisc
//! at a fixed priority and handle. A filter outlives the process without a pin (it belongs to
//! the qdisc), so a restarted proxy replaces it in place, never leaving the device without one;
//! each device with filters is recorded as a directory `devices/<ifindex>` under the pin
//! directory (bpffs holds no regular files), which `cleanup` reads to detach them.

use std::path::Path;

use aya::Ebpf;
use aya::programs::tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcAttachType, TcError, TcHandle};
use aya::programs::{ProgramError, SchedClassifier};
use nix::net::if_::{if_nameindex, if_nametoindex};
use roadkeeper_ebpf_common::INTERFACE_PROGRAMS;

use super::kernel::{ebpf_error, loaded};
use crate::Error;

/// The filters' priority (lower runs first) and handle: fixed, so that a restart finds them.
const PRIORITY: u16 = 1;
const HANDLE: TcHandle = TcHandle::new(0, 0x524b);

/// Where each program runs.
fn attach_type(name: &str) -> TcAttachType {
    if name == INTERFACE_PROGRAMS[0] { TcAttachType::Ingress } else { TcAttachType::Egress }
}

/// Loads the interface programs, attaches them to every device of `devices` (replacing what a
/// previous run attached) and detaches them from the recorded devices no longer listed.
pub fn attach(ebpf: &mut Ebpf, devices: &[String], pin_dir: &Path) -> Result<(), Error> {
    let recorded = pin_dir.join("devices");
    std::fs::create_dir_all(&recorded).map_err(|err| ebpf_error(format!("creating {}", recorded.display()), err))?;
    for name in INTERFACE_PROGRAMS {
        let program: &mut SchedClassifier = loaded(ebpf, name)?;
        for device in devices {
            attach_one(program, name, device)?;
        }
    }
    let mut wanted = Vec::new();
    for device in devices {
        let index = if_nametoindex(device.as_str())
            .map_err(|err| ebpf_error(format!("--bpf-devices: interface {device}"), err))?;
        let dir = recorded.join(index.to_string());
        std::fs::create_dir_all(&dir).map_err(|err| ebpf_error(format!("creating {}", dir.display()), err))?;
        wanted.push(index.to_string());
    }
    for entry in
        std::fs::read_dir(&recorded).map_err(|err| ebpf_error(format!("reading {}", recorded.display()), err))?
    {
        let entry = entry.map_err(|err| ebpf_error(format!("reading {}", recorded.display()), err))?;
        if !wanted.iter().any(|index| entry.file_name() == index.as_str()) {
            detach_recorded(&entry.path())?;
        }
    }
    Ok(())
}

/// Attaches `program` to `device`: in place of the filter a previous run left, else anew.
fn attach_one(program: &mut SchedClassifier, name: &str, device: &str) -> Result<(), Error> {
    let failed = |err: ProgramError| ebpf_error(format!("attaching program {name} to {device}"), err);
    match tc::qdisc_add_clsact(device) {
        Ok(()) | Err(TcError::AlreadyAttached) => {}
        Err(TcError::NetlinkError(err)) if err.raw_os_error() == Some(nix::errno::Errno::EEXIST as i32) => {}
        Err(err) => return Err(ebpf_error(format!("adding a clsact qdisc to {device}"), err)),
    }
    let kind = attach_type(name);
    let existing = SchedClassifierLink::attached(device, kind, PRIORITY, HANDLE, None)
        .map_err(|err| ebpf_error(format!("--bpf-devices: interface {device}"), err))?;
    let id = match program.attach_to_link(existing) {
        Ok(id) => id,
        Err(_) => program
            .attach_with_options(
                device,
                kind,
                TcAttachOptions::Netlink(NlOptions { priority: PRIORITY, handle: HANDLE, classid: None }),
            )
            .map_err(failed)?,
    };
    let link = program.take_link(id).map_err(failed)?;
    // Not dropped: dropping a link detaches it, and the filter must outlive the process.
    std::mem::forget(link);
    Ok(())
}

/// Detaches both programs from the device a `devices/<ifindex>` directory records (a device
/// gone since needs nothing), then removes the directory.
fn detach_recorded(dir: &Path) -> Result<usize, Error> {
    let index: u32 = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()).unwrap_or(0);
    let name = if_nameindex()
        .ok()
        .and_then(|all| all.iter().find(|i| i.index() == index).map(|i| i.name().to_string_lossy().into_owned()));
    let mut detached = 0;
    if let Some(name) = name {
        for program in INTERFACE_PROGRAMS {
            if let Ok(link) = SchedClassifierLink::attached(&name, attach_type(program), PRIORITY, HANDLE, None) {
                // Absent (someone removed the qdisc): nothing to detach.
                if aya::programs::links::Link::detach(link).is_ok() {
                    detached += 1;
                }
            }
        }
    }
    std::fs::remove_dir(dir).map_err(|err| ebpf_error(format!("removing {}", dir.display()), err))?;
    Ok(detached)
}

/// Detaches the programs from every recorded device: the number of filters removed.
pub fn detach_all(pin_dir: &Path) -> Result<usize, Error> {
    let recorded = pin_dir.join("devices");
    let Ok(entries) = std::fs::read_dir(&recorded) else { return Ok(0) };
    let mut detached = 0;
    for entry in entries.flatten() {
        detached += detach_recorded(&entry.path())?;
    }
    let _ = std::fs::remove_dir(&recorded);
    Ok(detached)
}

/// The interfaces that hold any of `addresses` (the default `--bpf-devices`), loopback aside.
pub fn holding(addresses: &[std::net::IpAddr]) -> Vec<String> {
    let mut devices: Vec<String> = Vec::new();
    let Ok(all) = nix::ifaddrs::getifaddrs() else { return devices };
    for ifa in all {
        let ip = ifa.address.and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| std::net::IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
        });
        if ip.is_some_and(|ip| addresses.contains(&ip) && !ip.is_loopback()) && !devices.contains(&ifa.interface_name) {
            devices.push(ifa.interface_name);
        }
    }
    devices
}
