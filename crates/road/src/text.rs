//! A road as text, one station per paragraph, for people.

use std::fmt::Write as _;

use roadkeeper_rules::trace::{Effect, Step, Via};

use crate::road::{Leg, Road};

/// Most rules of one path printed; the rest are counted.
const MAX_RULES_SHOWN: usize = 200;

/// `road` as text: the request, the DNS answer, each leg (Service, endpoints, the rules that
/// matched, in order, with their verdicts, where the packet lands, masquerading), the Ingress.
pub fn render(road: &Road) -> String {
    let mut out = String::new();
    let from = &road.from;
    let on = from.node.as_deref().filter(|n| *n != from.name).map(|n| format!(", on {n}")).unwrap_or_default();
    let host = road.request.host_header.as_deref().map(|h| format!(" with Host {h}")).unwrap_or_default();
    let _ = writeln!(out, "visitor     {}{host} from {} ({}{on})", road.request.url, from.name, from.address);
    match &road.dns {
        Some(dns) => {
            let _ = writeln!(out, "DNS         {} -> {} ({})", dns.name, dns.address, dns.resolver);
            for (name, answer) in &dns.asked {
                let _ = writeln!(out, "              {name}: {answer}");
            }
        }
        None => {
            let _ = writeln!(out, "DNS         none: {} is an address", road.request.host);
        }
    }
    for (index, leg) in road.legs.iter().enumerate() {
        if index == 1
            && let Some(ingress) = &road.ingress
        {
            render_ingress(&mut out, ingress);
        }
        render_leg(&mut out, leg);
    }
    if road.legs.len() == 1
        && let Some(ingress) = &road.ingress
    {
        render_ingress(&mut out, ingress);
    }
    out
}

fn render_ingress(out: &mut String, ingress: &crate::IngressStation) {
    let _ = writeln!(out, "Ingress     {} routes Host {} path {}", ingress.controller, ingress.host, ingress.path);
    let tried: Vec<String> = ingress.tried.iter().map(|(key, n)| format!("{key} ({n} paths)")).collect();
    let _ = writeln!(out, "              host keys tried: {}", tried.join(", "));
    if let (Some(rule), Some(backend)) = (&ingress.rule, &ingress.backend) {
        let endpoints: Vec<String> = ingress.endpoints.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "              matched {rule} -> {backend}, endpoints {}", endpoints.join(", "));
    }
    if let Some(failure) = &ingress.failure {
        let _ = writeln!(out, "              {failure}");
    }
}

fn render_leg(out: &mut String, leg: &Leg) {
    let _ = writeln!(
        out,
        "node        {}: {}; packet {} -> {} TCP",
        leg.node, leg.node_reason, leg.from.address, leg.destination
    );
    match &leg.service {
        Some(service) => {
            let name = if service.port_name.is_empty() { String::new() } else { format!(" ({})", service.port_name) };
            let _ = writeln!(
                out,
                "Service     {} port {}{name}: {}, {}",
                service.service, service.port, service.frontend, service.policy
            );
            if service.endpoints.is_empty() {
                let _ = writeln!(out, "              no endpoints in its EndpointSlices");
            }
            for e in &service.endpoints {
                let pod = e.pod.as_deref().unwrap_or("-");
                let node = e.node.as_deref().unwrap_or("-");
                let state = if e.terminating {
                    "terminating"
                } else if e.ready {
                    "ready"
                } else {
                    "not ready"
                };
                let eligible = match &e.ineligible {
                    None => "eligible here".to_owned(),
                    Some(why) => format!("not eligible here: {why}"),
                };
                let _ =
                    writeln!(out, "              {} {} pod {pod} on {node}: {state}, {eligible}", e.slice, e.address);
            }
        }
        None => {
            let _ = writeln!(out, "Service     none: {} is no Service frontend on {}", leg.destination, leg.node);
        }
    }
    let trace = &leg.rules.trace;
    let what = if trace.backend == "ebpf" { "programs and maps" } else { "rules" };
    let _ =
        writeln!(out, "node proxy  {} {what} of {}, in the order the packet meets them:", leg.rules.backend, leg.node);
    let shown = leg.followed.unwrap_or(0);
    render_steps(out, &trace.steps(shown));
    for landing in &leg.landings {
        let mark = if Some(landing.path) == leg.followed { "*" } else { " " };
        let pod = match (&landing.pod, &landing.pod_node) {
            (Some(pod), Some(node)) => format!(": pod {pod} on {node}"),
            (Some(pod), None) => format!(": pod {pod}"),
            _ => String::new(),
        };
        let _ = writeln!(out, "pod       {mark} {:>5.1}% {}{pod}", landing.probability * 100.0, landing.outcome);
        let masquerade = match &landing.masquerade {
            Some(why) => format!("source masqueraded (to the node's address): {why}"),
            None => "source kept (not masqueraded)".to_owned(),
        };
        if landing.fate == "delivered" {
            let _ = writeln!(out, "                  {masquerade}");
        }
    }
}

fn render_steps(out: &mut String, steps: &[&Step]) {
    let mut skipped = 0usize;
    let mut shown = 0usize;
    // The chains called and not yet returned from: a `return` goes back to the one below.
    let mut calls: Vec<(&str, &str)> = Vec::new();
    for step in steps {
        match step {
            Step::Hook { hook } => {
                let _ = writeln!(out, "  hook {}", format!("{hook:?}").to_lowercase());
            }
            Step::Enter { table, chain, via } => {
                let how = match via {
                    Via::Hook { hook } => {
                        calls.clear();
                        format!("({hook})")
                    }
                    Via::Jump => "(jump)".to_owned(),
                    Via::Goto => {
                        calls.pop();
                        "(goto)".to_owned()
                    }
                };
                calls.push((table, chain));
                let _ = writeln!(out, "    {table} {chain} {how}");
            }
            Step::SkipNat { table, chain } => {
                let _ = writeln!(out, "    {table} {chain}: skipped, the connection's NAT is set");
            }
            Step::Rule { index, rule, matched, element, chance, effects, .. } => {
                if !matched {
                    skipped += 1;
                    continue;
                }
                shown += 1;
                if shown > MAX_RULES_SHOWN {
                    continue;
                }
                let mut extra = Vec::new();
                if let Some(element) = element {
                    extra.push(format!("element {element}"));
                }
                if let Some(chance) = chance {
                    extra.push(format!("chance {:.3}", chance));
                }
                let effects: Vec<String> = effects.iter().map(effect).collect();
                let extra = if extra.is_empty() { String::new() } else { format!(" [{}]", extra.join(", ")) };
                let _ = writeln!(out, "      #{index} {rule}{extra} => {}", effects.join(", "));
            }
            Step::Leave { .. } => {
                calls.pop();
                if let Some((table, chain)) = calls.last() {
                    let _ = writeln!(out, "    {table} {chain} (back)");
                }
            }
            Step::Route { to, destination } => {
                let _ = writeln!(out, "  routing: {destination} is {}", format!("{to:?}").to_lowercase());
            }
            Step::Program { program, attach } => {
                calls.clear();
                let _ = writeln!(out, "  BPF program {program}: {attach}");
            }
            Step::Lookup { map, key, found, chance, effects } => {
                let found = found.as_deref().unwrap_or("no entry");
                let chance = chance.map(|c| format!(" [chance {c:.3}]")).unwrap_or_default();
                let effects: Vec<String> = effects.iter().map(effect).collect();
                let effects = if effects.is_empty() { String::new() } else { format!(" => {}", effects.join(", ")) };
                let _ = writeln!(out, "      {map}[{key}] -> {found}{chance}{effects}");
            }
        }
    }
    if shown > MAX_RULES_SHOWN {
        let _ =
            writeln!(out, "      ({} more matching rules not shown; --output json has them)", shown - MAX_RULES_SHOWN);
    }
    if skipped > 0 {
        let _ = writeln!(out, "    ({skipped} rules did not match; --output json lists them)");
    }
}

fn effect(effect: &Effect) -> String {
    match effect {
        Effect::Mark { mark } => format!("mark {mark:#x}"),
        Effect::Affinity { set } => format!("remember source in {set}"),
        Effect::Dnat { to } => format!("DNAT {to}"),
        Effect::Connect { to } => format!("the socket connects to {to}"),
        Effect::Masquerade => "masquerade".to_owned(),
        Effect::Jump { chain } => format!("jump {chain}"),
        Effect::Goto { chain } => format!("goto {chain}"),
        Effect::Return => "return".to_owned(),
        Effect::Accept => "accept".to_owned(),
        Effect::Drop => "drop".to_owned(),
        Effect::Reject { with } => format!("reject {with}"),
    }
}
