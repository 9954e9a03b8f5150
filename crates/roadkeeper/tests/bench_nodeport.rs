//! `roadkeeper bench nodeport` end to end (root; eBPF mode with the binary's default feature
//! `ebpf`): in every mode it measures, real datagrams from the sender namespace reach the pod
//! through the node's NodePort (the bench fails otherwise), and it prints one row per mode with
//! its ratio to the first. A short run: the figures of BENCHMARKS.md come from longer ones.
#![cfg(feature = "ebpf")]

use std::process::Command;

#[test]
fn every_mode_forwards_the_node_ports_packets_and_gets_a_row() {
    let out = Command::new(env!("CARGO_BIN_EXE_roadkeeper"))
        .args(["bench", "nodeport", "--services", "20", "--senders", "1", "--seconds", "1"])
        .output()
        .expect("roadkeeper runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for mode in ["nftables", "iptables", "ebpf"] {
        let row = stdout.lines().find(|l| l.starts_with(&format!("| {mode} |"))).unwrap_or_else(|| panic!("{stdout}"));
        let received: f64 = row.split('|').nth(2).unwrap().trim().trim_end_matches("/s").parse().unwrap();
        assert!(received > 100.0, "{mode}: {row}");
    }
    assert!(stdout.contains("| nftables |") && stdout.contains("| 1.00 |"), "{stdout}");
}
