//! The one netfilter table eBPF mode keeps on a node (`inet roadkeeper-ebpf`): a fixed handful of
//! rules, the same at any number of Services, that masquerade and reject the external traffic
//! the interface programs mark. Translation is the programs'; SNAT and the answers to a
//! frontend without endpoints stay with the kernel's connection tracking and REJECT, as Cilium
//! leaves masquerading to netfilter when BPF masquerading is off.

/// The table's name (family `inet`: both IP families).
pub const TABLE: &str = "roadkeeper-ebpf";

/// The bit the interface programs set on traffic to masquerade.
pub const MASQUERADE_MARK: u32 = roadkeeper_ebpf_common::MARK_MASQUERADE;
/// The bit they set on traffic to a frontend without endpoints.
pub const REJECT_MARK: u32 = roadkeeper_ebpf_common::MARK_REJECT;

/// The chain that masquerades marked traffic (`type nat hook postrouting`).
pub const MASQUERADE_CHAIN: &str = "nat-postrouting";
/// The chains that reject marked traffic: to a local address (`input`), and forwarded.
pub const REJECT_CHAINS: [(&str, &str); 2] = [("filter-input", "input"), ("filter-forward", "forward")];

/// The one rule of [`MASQUERADE_CHAIN`].
pub fn masquerade_rule() -> String {
    format!("meta mark & {MASQUERADE_MARK:#x} == {MASQUERADE_MARK:#x} masquerade fully-random")
}

/// The rules of each of [`REJECT_CHAINS`]: TCP gets a reset, anything else an ICMP error.
pub fn reject_rules() -> [String; 2] {
    let mark = format!("meta mark & {REJECT_MARK:#x} == {REJECT_MARK:#x}");
    [format!("{mark} meta l4proto tcp reject with tcp reset"), format!("{mark} reject")]
}

/// The `nft -f` script that replaces the table whole.
pub fn script() -> String {
    let [tcp, other] = reject_rules();
    let reject = REJECT_CHAINS.map(|(chain, hook)| {
        format!(
            "\tchain {chain} {{\n\t\ttype filter hook {hook} priority filter - 1; policy accept;\n\t\t{tcp}\n\t\t{other}\n\t}}\n"
        )
    });
    format!(
        "add table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n\
         \tchain {MASQUERADE_CHAIN} {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\t{}\n\t}}\n{}}}\n",
        masquerade_rule(),
        reject.concat(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_replaced_whole_and_matches_the_marks() {
        let script = script();
        assert!(script.starts_with("add table inet roadkeeper-ebpf\ndelete table inet roadkeeper-ebpf\n"));
        assert!(script.contains("meta mark & 0x4000 == 0x4000 masquerade fully-random"), "{script}");
        assert_eq!(script.matches("meta mark & 0x8000 == 0x8000").count(), 4, "{script}");
        assert_eq!(script.matches("chain ").count(), 3);
    }
}
