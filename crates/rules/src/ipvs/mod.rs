//! The IPVS backend's planning (`--proxy-mode ipvs`), as upstream kube-proxy's IPVS proxier lays
//! it out: every ClusterIP, externalIP and load-balancer IP on the dummy interface `kube-ipvs0`,
//! one IPVS virtual server per frontend (ClusterIP, NodePort on each NodePort address,
//! externalIP, LB IP) and one real server per endpoint, from the same service table
//! ([`crate::table`]) and endpoint selection as the other modes.
//!
//! [`plan`] is what the kernel should hold ([`IpvsPlan`]: the IPVS table and the helper rules),
//! [`diff`] the kernel operations from what was applied to a new plan (one endpoint change is one
//! real-server operation), [`state`] every Service's plan kept so that a partial sync costs
//! O(the changed Services), [`helpers`] the rules IPVS cannot express, [`show`] the plan as
//! `ipvsadm -Ln` prints it.
//!
//! # Helper rules: nftables, not iptables + ipset
//!
//! IPVS balances, but masquerading, hairpin, source ranges, REJECT/DROP for Services without
//! (local) endpoints and rejecting other ports on `kube-ipvs0` addresses need netfilter rules.
//! Upstream writes them as iptables chains matching ipsets (`KUBE-CLUSTER-IP`, `KUBE-LOOP-BACK`,
//! `KUBE-LOAD-BALANCER-SOURCE-CIDR`...). roadkeeper writes them as one nftables table per family,
//! `roadkeeper-ipvs`, whose named sets hold the same elements as those ipsets:
//! - the behaviour is the same: the same elements, matched at the same hooks before IPVS sees
//!   the packet (IPVS takes new connections at `LOCAL_IN` and, for local clients, at `LOCAL_OUT`
//!   priority -99; the filter chains run before them), masquerading on the same mark;
//! - it needs no `ipset` module or tool, nor a second netlink protocol (ipset's): `nft -f`
//!   applies it, the whole table replaced in one atomic transaction by a full sync, set
//!   elements added and deleted one by one ([`HelperElement`]) by a partial one;
//! - it is one table of our own, so `roadkeeper cleanup` removes exactly it and it never touches
//!   the kubelet's or another program's iptables chains;
//! - nftables is what upstream recommends in IPVS's place, and the tracer already models it.
//!
//! The cost: operators who list `ipset list KUBE-CLUSTER-IP` find the same elements with
//! `nft list set ip roadkeeper-ipvs cluster-ips` instead.

pub mod diff;
pub mod helpers;
pub mod plan;
pub mod show;
pub mod state;

pub use diff::IpvsOp;
pub use helpers::{ElementShape, HelperElement, HelperRules, element_script};
pub use plan::{FrontendKind, IpvsPlan, IpvsTable, RealServer, Scheduler, VirtualKey, VirtualServer};
pub use state::{IpvsState, Touched};
