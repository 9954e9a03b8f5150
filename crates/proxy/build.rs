//! Builds eBPF mode's BPF programs (`crates/ebpf-programs`) into `OUT_DIR/roadkeeper-ebpf.o`,
//! which `src/ebpf/kernel.rs` embeds. The BPF target needs the nightly toolchain with `rust-src`
//! and `bpf-linker`; the rest of the workspace builds on stable. Only with feature `ebpf-kernel`.
//!
//! By hand rather than with `aya-build`: it only runs one `cargo build` with a cleaned
//! environment, and its versions that build the BPF side of aya-ebpf 0.2 need a newer rustc
//! than this workspace's.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The toolchain that builds the BPF side (override: `ROADKEEPER_BPF_TOOLCHAIN`).
const TOOLCHAIN: &str = "nightly";

fn main() {
    if std::env::var_os("CARGO_FEATURE_EBPF_KERNEL").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let programs = manifest.join("../ebpf-programs");
    for watched in ["src", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", programs.join(watched).display());
    }
    println!("cargo:rerun-if-changed={}", manifest.join("../ebpf-common/src").display());
    println!("cargo:rerun-if-env-changed=ROADKEEPER_BPF_TOOLCHAIN");
    let toolchain = std::env::var("ROADKEEPER_BPF_TOOLCHAIN").unwrap_or_else(|_| TOOLCHAIN.into());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // One BPF target directory for every profile and check of the workspace: built once.
    let target_dir = workspace_target(&out).join("bpf");

    let mut cargo = Command::new("rustup");
    cargo.current_dir(&programs).args(["run", &toolchain, "cargo", "build", "--release", "--locked"]);
    cargo.args(["-Z", "build-std=core", "--target", "bpfel-unknown-none", "--target-dir"]).arg(&target_dir);
    // Nothing of this (stable, host) build may leak into the nested one.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let outer =
            (key.starts_with("CARGO") && key != "CARGO_HOME") || (key.starts_with("RUST") && key != "RUSTUP_HOME");
        if outer {
            cargo.env_remove(key.as_ref());
        }
    }
    let status = cargo.status().unwrap_or_else(|err| panic!("cannot run rustup to build the BPF programs: {err}"));
    assert!(
        status.success(),
        "building the BPF programs (crates/ebpf-programs) failed: they need `rustup toolchain install {toolchain}`, \
         `rustup component add rust-src --toolchain {toolchain}` and `cargo install bpf-linker@0.10.0 --locked`"
    );
    let object = target_dir.join("bpfel-unknown-none/release/roadkeeper-ebpf");
    std::fs::copy(&object, out.join("roadkeeper-ebpf.o"))
        .unwrap_or_else(|err| panic!("copying {}: {err}", object.display()));
}

/// The workspace's target directory: the ancestor of `out` (`target/<profile>/build/<pkg>/out`)
/// above the profile directory.
fn workspace_target(out: &Path) -> PathBuf {
    out.ancestors().nth(4).map_or_else(|| out.to_path_buf(), Path::to_path_buf)
}
