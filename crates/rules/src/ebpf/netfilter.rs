//! The one netfilter table eBPF mode keeps on a node (`inet roadkeeper-ebpf`): a fixed handful of
//! rules, the same at any number of Services, that masquerade and reject the external traffic
//! the interface programs mark. Translation is the programs'; SNAT and the answers to a
//! frontend without endpoints stay with the kernel's connection tracking and REJECT, as Cilium
//! leaves masquerading to netfilter when BPF masquerading is off.

/// The table's name (family `inet`: both IP families).
pub const TABLE: &str = "roadkeeper-ebpf";

/// The `nft -f` script that replaces the table whole: `masquerade_mark` marks traffic to
/// masquerade, `reject_mark` traffic to a frontend without endpoints.
pub fn script(masquerade_mark: u32, reject_mark: u32) -> String {
    let reject = |chain: &str, hook: &str| {
        format!(
            "\tchain {chain} {{\n\t\ttype filter hook {hook} priority filter - 1; policy accept;\n\
             \t\tmeta mark & {reject_mark:#x} == {reject_mark:#x} meta l4proto tcp reject with tcp reset\n\
             \t\tmeta mark & {reject_mark:#x} == {reject_mark:#x} reject\n\t}}\n"
        )
    };
    format!(
        "add table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n\
         \tchain nat-postrouting {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tmeta mark & {masquerade_mark:#x} == {masquerade_mark:#x} masquerade fully-random\n\t}}\n{}{}}}\n",
        reject("filter-input", "input"),
        reject("filter-forward", "forward"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_replaced_whole_and_matches_the_marks() {
        let script = script(0x4000, 0x8000);
        assert!(script.starts_with("add table inet roadkeeper-ebpf\ndelete table inet roadkeeper-ebpf\n"));
        assert!(script.contains("meta mark & 0x4000 == 0x4000 masquerade fully-random"), "{script}");
        assert_eq!(script.matches("meta mark & 0x8000 == 0x8000").count(), 4, "{script}");
        assert_eq!(script.matches("chain ").count(), 3);
    }
}
