//! eBPF mode's kernel side on this machine's kernel (root; feature `ebpf-kernel`, which builds
//! the BPF programs with the nightly toolchain): every socket program passes the verifier and is
//! attached to a cgroup of its own, a connection from that cgroup to a frontend reaches its
//! backend while `getpeername()` still names the frontend, a frontend without backends refuses,
//! a process outside the cgroup is left alone, and a second load replaces the links.
#![cfg(feature = "ebpf-kernel")]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;

use roadkeeper_proxy::ebpf::kernel::{self, EbpfKernel, Placement};
use roadkeeper_rules::ebpf::{Empty, FrontendKey, MapOp, Master, Scope, Selection, SlotKey, SlotValue};
use roadkeeper_rules::table::Protocol;

/// A cgroup v2 and a bpffs mount in a temporary directory, unmounted on drop.
struct Mounts {
    dir: tempfile::TempDir,
}

impl Mounts {
    fn new() -> Mounts {
        let dir = tempfile::tempdir().expect("temp dir");
        for (fs, sub) in [("cgroup2", "cgroup"), ("bpf", "bpf")] {
            let at = dir.path().join(sub);
            std::fs::create_dir(&at).expect("mount point");
            let ok = Command::new("mount").args(["-t", fs, fs]).arg(&at).status().expect("mount").success();
            assert!(ok, "mount -t {fs}");
        }
        Mounts { dir }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        // The node cgroup of a test that failed before removing it (its threads are gone).
        let _ = std::fs::remove_dir(self.path("cgroup").join(format!("rk-ebpf-{}", std::process::id())));
        for sub in ["cgroup", "bpf"] {
            let _ = Command::new("umount").arg(self.path(sub)).status();
        }
    }
}

/// Moves this process into cgroup `dir`.
fn enter(dir: &Path) {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).expect("move into the cgroup");
}

fn frontend(address: &str) -> FrontendKey {
    FrontendKey { address: address.parse().unwrap(), port: 81, protocol: Protocol::Tcp, scope: Scope::Internal }
}

fn master(id: u16, count: u16) -> SlotValue {
    SlotValue::Master(Master {
        id,
        count,
        selection: Selection::Random,
        empty: Empty::Reject,
        affinity: 0,
        source_ranges: false,
        masquerade: false,
    })
}

#[test]
fn socket_programs_translate_connections_of_their_cgroup_only() {
    let mounts = Mounts::new();
    let node = mounts.path("cgroup").join(format!("rk-ebpf-{}", std::process::id()));
    std::fs::create_dir(&node).expect("node cgroup");
    let placement = Placement { cgroup: node.clone(), pin_dir: mounts.path("bpf").join("node-a"), devices: Vec::new() };
    let mut kernel = EbpfKernel::open(&placement, &Default::default()).expect("programs load and attach");

    let listener = TcpListener::bind("127.0.0.1:0").expect("backend");
    let backend = listener.local_addr().unwrap();
    // Frontends on loopback addresses nothing listens on, so that an untranslated connection
    // is refused by the kernel itself.
    let (served, empty) = (frontend("127.0.0.2"), frontend("127.0.0.3"));
    kernel
        .apply(&[
            MapOp::SetBackend(1, backend),
            MapOp::SetRevNat(1, (served.address, 81)),
            MapOp::SetSlot(SlotKey { frontend: served, slot: 1 }, SlotValue::Backend(1)),
            MapOp::SetSlot(SlotKey { frontend: served, slot: 0 }, master(1, 1)),
            MapOp::SetSlot(SlotKey { frontend: empty, slot: 0 }, master(2, 0)),
        ])
        .expect("map updates");
    let front: SocketAddr = "127.0.0.2:81".parse().unwrap();
    let root = mounts.path("cgroup");
    let (inside, refused, outside) = std::thread::scope(|s| {
        s.spawn(|| {
            enter(&node);
            let inside = TcpStream::connect(front).map(|s| s.peer_addr().unwrap()).map_err(|e| e.to_string());
            let refused = TcpStream::connect("127.0.0.3:81").map(|_| ()).map_err(|e| e.kind());
            enter(&root);
            let outside = TcpStream::connect(front).map(|_| ()).map_err(|e| e.kind());
            (inside, refused, outside)
        })
        .join()
        .unwrap()
    });
    assert_eq!(inside, Ok(front), "reached the backend {backend}, named as the frontend");
    assert!(listener.accept().is_ok(), "the backend got the connection");
    assert_eq!(refused, Err(std::io::ErrorKind::ConnectionRefused), "no backend: refused at connect()");
    assert_eq!(outside, Err(std::io::ErrorKind::ConnectionRefused), "outside the cgroup nothing is translated");

    drop(kernel);
    let again = EbpfKernel::open(&placement, &Default::default()).expect("a second load replaces the links");
    assert!(again.in_place());
    assert_eq!(again.read().expect("maps").backends.get(&1), Some(&backend), "the pinned maps are adopted");
    drop(again);
    assert_eq!(kernel::cleanup(&placement.pin_dir).expect("cleanup"), 17, "8 links and 9 maps");
    std::fs::remove_dir(&node).expect("the node cgroup is empty again");
}
