//! What `roadkeeper cleanup` removes from iptables, planned from an `iptables-save` listing: the
//! chains roadkeeper's iptables mode writes (kube-proxy's, under the same names) and every rule
//! of another chain that jumps to one of them. Other `KUBE-*` chains stay, with their rules and
//! jumps: the kubelet's (`KUBE-FIREWALL`, which the iptables mode also ensures as kube-proxy does
//! without owning it, `KUBE-KUBELET-CANARY`, `KUBE-IPTABLES-HINT`, and `KUBE-MARK-DROP` of
//! kubelets before 1.28), the IPVS mode's and kube-router's.

use super::plan::{
    KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_CANARY,
    KUBE_PROXY_FIREWALL, KUBE_SERVICES, is_service_chain,
};

/// The fixed chains of the iptables mode (each in one table or several), as kube-proxy's.
pub const FIXED_CHAINS: [&str; 8] = [
    KUBE_SERVICES,
    KUBE_EXTERNAL_SERVICES,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_MARK_MASQ,
    KUBE_FORWARD,
    KUBE_PROXY_FIREWALL,
    KUBE_PROXY_CANARY,
];

/// The per-Service chains of kube-proxy before 1.24 (`externalTrafficPolicy: Local`): removed
/// too, as they jump to `KUBE-SEP-` chains, which cannot be deleted while referenced.
const OLD_SERVICE_CHAIN_PREFIX: &str = "KUBE-XLB-";

/// True for a chain `roadkeeper cleanup` removes.
pub fn is_removed(chain: &str) -> bool {
    FIXED_CHAINS.contains(&chain) || is_service_chain(chain) || chain.starts_with(OLD_SERVICE_CHAIN_PREFIX)
}

/// The `iptables-restore --noflush` input that removes the chains of an `iptables-save` listing
/// that [`is_removed`] picks, and every rule of another chain jumping to one of them; empty when
/// there is none.
pub fn restore_input(listing: &str) -> String {
    let mut out = String::new();
    let mut table: Option<&str> = None;
    let mut chains: Vec<&str> = Vec::new();
    let mut deletes: Vec<&str> = Vec::new();
    for line in listing.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Some(name.trim());
            chains.clear();
            deletes.clear();
        } else if let Some(decl) = line.strip_prefix(':') {
            if let Some(chain) = decl.split_whitespace().next().filter(|c| is_removed(c)) {
                chains.push(chain);
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let words: Vec<&str> = rule.split_whitespace().collect();
            let jumps_to_removed = words.windows(2).any(|w| matches!(w[0], "-j" | "-g") && is_removed(w[1]));
            if jumps_to_removed && !words.first().is_some_and(|chain| is_removed(chain)) {
                deletes.push(rule);
            }
        } else if line.trim() == "COMMIT"
            && let Some(name) = table.take()
            && !(chains.is_empty() && deletes.is_empty())
        {
            out.push_str(&format!("*{name}\n"));
            for chain in &chains {
                out.push_str(&format!(":{chain} - [0:0]\n"));
            }
            for rule in &deletes {
                out.push_str(&format!("-D {rule}\n"));
            }
            for chain in &chains {
                out.push_str(&format!("-X {chain}\n"));
            }
            out.push_str("COMMIT\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_our_chains_and_the_jumps_to_them_only() {
        let listing = "# Generated\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n\
            :KUBE-XLB-Y - [0:0]\n:OTHER - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n:KUBE-MARK-DROP - [0:0]\n\
            -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
            -A PREROUTING -j OTHER\n-A KUBE-SERVICES -j KUBE-SVC-X\n-A KUBE-XLB-Y -j KUBE-MARK-DROP\n\
            -A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000\nCOMMIT\n\
            *filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-ROUTER-INPUT - [0:0]\n\
            -A INPUT -j KUBE-FIREWALL\n-A INPUT -j KUBE-ROUTER-INPUT\n-A KUBE-ROUTER-INPUT -g KUBE-FORWARD\n\
            -A KUBE-FIREWALL -d 127.0.0.0/8 -j DROP\nCOMMIT\n";
        assert_eq!(
            restore_input(listing),
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n:KUBE-XLB-Y - [0:0]\n\
             -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -X KUBE-SERVICES\n-X KUBE-SVC-X\n-X KUBE-XLB-Y\nCOMMIT\n\
             *filter\n-D KUBE-ROUTER-INPUT -g KUBE-FORWARD\nCOMMIT\n"
        );
        assert_eq!(restore_input("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"), "");
    }

    #[test]
    fn the_kubelets_chains_are_not_ours() {
        for theirs in
            ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP", "KUBE-ROUTER-INPUT"]
        {
            assert!(!is_removed(theirs), "{theirs}");
        }
        for ours in
            FIXED_CHAINS.iter().copied().chain(["KUBE-SVC-A", "KUBE-SVL-A", "KUBE-EXT-A", "KUBE-FW-A", "KUBE-SEP-A"])
        {
            assert!(is_removed(ours), "{ours}");
        }
    }
}
