//! Edges of the spec to [`PlannedEdge`]s: ends resolved to ports, capacity,
//! age and types checked; then the graph as a whole (every required input
//! fed, no undeclared cycle).

use super::source_map::List;
use super::{closest, Ctx};
use crate::error::Diagnostic;
use crate::plan::{PlannedEdge, PlannedStage};
use crate::port::PortType;
use crate::spec::{PipelineSpec, Policy, DEFAULT_CAPACITY, MAX_CAPACITY};
use std::collections::{HashMap, HashSet, VecDeque};

/// Resolve every edge; check ends, capacity, age, types, duplicates.
/// Returns the planned edges, for each its index in the spec, and every
/// input port that some edge leads to (even an edge with other problems, so
/// that one mistake is not also reported as a dangling input).
pub(super) fn plan_edges(
    spec: &PipelineSpec,
    ids: &HashMap<&str, usize>,
    stages: &[Option<PlannedStage>],
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) -> (Vec<PlannedEdge>, Vec<usize>, HashSet<(usize, usize)>) {
    let mut edges: Vec<PlannedEdge> = Vec::new();
    let mut spec_index = Vec::new();
    let mut fed = HashSet::new();
    let mut seen: HashMap<(PortRef, PortRef), usize> = HashMap::new();
    for (i, e) in spec.edges.iter().enumerate() {
        // An edge between two parts says so: a mismatch there names both.
        let part_of_end = |end: &str| {
            let id = end.split('.').next().unwrap_or(end);
            spec.stages
                .iter()
                .find(|s| s.id == id)
                .map(crate::parts::part_of)
        };
        let ctx = match (part_of_end(&e.from), part_of_end(&e.to)) {
            (Some(a), Some(b)) if a != b => {
                format!("edge `{} -> {}` (part `{a}` -> part `{b}`)", e.from, e.to)
            }
            _ => format!("edge `{} -> {}`", e.from, e.to),
        };
        let item = cx.map.item_pos(List::Edges, i);
        let mut ok = true;
        let mut ends = [None, None];
        for (k, (end, field, output)) in [(&e.from, "from", true), (&e.to, "to", false)]
            .into_iter()
            .enumerate()
        {
            match resolve_end(end, output, ids, stages) {
                Ok(r) => {
                    if !output {
                        fed.insert(r);
                    }
                    ends[k] = Some(r);
                }
                // The stage itself is invalid and already reported.
                Err(None) => ok = false,
                Err(Some((m, fix))) => {
                    ok = false;
                    diags.push(cx.diag(
                        cx.field_or_item(List::Edges, i, field),
                        ctx.clone(),
                        m,
                        fix,
                    ));
                }
            }
        }
        let capacity = e.capacity.unwrap_or(DEFAULT_CAPACITY);
        if capacity == 0 || capacity > MAX_CAPACITY {
            diags.push(cx.diag(
                cx.field_or_item(List::Edges, i, "capacity"),
                ctx.clone(),
                format!("capacity {capacity} is out of range 1..={MAX_CAPACITY}"),
                if capacity == 0 {
                    "a bounded edge needs room for at least one message; for newest-only use \
                     `capacity: 1` with `policy: latest`"
                } else {
                    "a queue that large hides a slow stage and costs memory; use a few messages \
                     (default 8) and a dropping policy if the consumer may lag"
                },
            ));
        }
        let max_age = match e.max_age.as_ref().map(|d| d.to_duration()) {
            Some(Ok(d)) if d.is_zero() => {
                diags.push(cx.diag(
                    cx.field_or_item(List::Edges, i, "max_age"),
                    ctx.clone(),
                    "max_age must be greater than zero",
                    "e.g. `max_age: 200ms`, or remove it to keep messages of any age",
                ));
                None
            }
            Some(Ok(d)) => Some(d),
            Some(Err(m)) => {
                diags.push(cx.diag(
                    cx.field_or_item(List::Edges, i, "max_age"),
                    ctx.clone(),
                    format!("max_age: {m}"),
                    "e.g. `max_age: 200ms`",
                ));
                None
            }
            None => None,
        };
        let (true, Some(from), Some(to)) = (ok, ends[0], ends[1]) else {
            continue;
        };
        let (Some(fs), Some(ts)) = (&stages[from.0], &stages[to.0]) else {
            continue;
        };
        let fty = fs.ports.outputs[from.1].ty;
        let tty = ts.ports.inputs[to.1].ty;
        if let Err(hint) = fty.check_into(&tty) {
            diags.push(cx.diag(
                item,
                ctx.clone(),
                format!(
                    "type mismatch: `{}.{}` produces {fty} but `{}.{}` takes {tty}",
                    fs.id, fs.ports.outputs[from.1].name, ts.id, ts.ports.inputs[to.1].name
                ),
                hint,
            ));
        }
        if let Some(first) = seen.insert((from, to), i) {
            let line = cx
                .map
                .item_pos(List::Edges, first)
                .map(|p| format!(" (first on line {})", p.line))
                .unwrap_or_default();
            diags.push(cx.diag(
                item,
                ctx.clone(),
                format!("the same edge is declared twice{line}"),
                "remove one of them",
            ));
        }
        edges.push(PlannedEdge {
            from,
            to,
            capacity,
            policy: e.policy.unwrap_or(Policy::Block),
            max_age,
            back_edge: e.back_edge,
            label: format!("{} -> {}", e.from, e.to),
        });
        spec_index.push(i);
    }
    (edges, spec_index, fed)
}

/// Every required input must be fed by an edge.
pub(super) fn check_inputs(
    stages: &[Option<PlannedStage>],
    fed: &HashSet<(usize, usize)>,
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) {
    for (i, s) in stages.iter().enumerate() {
        let Some(s) = s else { continue };
        for (p, port) in s.ports.inputs.iter().enumerate() {
            if !port.required || fed.contains(&(i, p)) {
                continue;
            }
            let feeders = compatible_outputs(stages, i, &port.ty);
            let example = feeders.first().map_or("SOME_STAGE.PORT", String::as_str);
            let mut fix = format!(
                "add an edge `{{ from: {example}, to: {}.{} }}`",
                s.id, port.name
            );
            if feeders.len() > 1 {
                fix.push_str(&format!("; outputs that fit: {}", feeders.join(", ")));
            }
            diags.push(cx.diag(
                cx.map.item_pos(List::Stages, i),
                format!("stage `{}`", s.id),
                format!(
                    "required input `{}` ({}) has no incoming edge",
                    port.name, port.ty
                ),
                fix,
            ));
        }
    }
}

/// Up to four `stage.port` outputs (other than stage `skip`) that can feed `ty`.
fn compatible_outputs(stages: &[Option<PlannedStage>], skip: usize, ty: &PortType) -> Vec<String> {
    stages
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != skip)
        .filter_map(|(_, s)| s.as_ref())
        .flat_map(|s| {
            s.ports
                .outputs
                .iter()
                .filter(|o| o.ty.check_into(ty).is_ok())
                .map(move |o| format!("{}.{}", s.id, o.name))
        })
        .take(4)
        .collect()
}

/// (stage index, port index).
type PortRef = (usize, usize);

type EndResult = std::result::Result<PortRef, Option<(String, String)>>;

/// Resolve `stage.port`. `Err(None)`: the stage exists but is itself invalid.
fn resolve_end(
    s: &str,
    output: bool,
    ids: &HashMap<&str, usize>,
    stages: &[Option<PlannedStage>],
) -> EndResult {
    let (id, port) = match s.split_once('.') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    let Some(&i) = ids.get(id) else {
        let mut known: Vec<&str> = ids.keys().copied().collect();
        known.sort_unstable();
        return Err(Some((
            format!("no stage `{id}`"),
            match closest(id, &known) {
                Some(c) => format!("did you mean `{c}`? stages are: {}", known.join(", ")),
                None => format!("write `STAGE.PORT` with one of: {}", known.join(", ")),
            },
        )));
    };
    let Some(st) = &stages[i] else {
        return Err(None);
    };
    let ports = if output {
        &st.ports.outputs
    } else {
        &st.ports.inputs
    };
    let dir = if output { "output" } else { "input" };
    let names: Vec<&str> = ports.iter().map(|p| p.name.as_str()).collect();
    let listed = || {
        ports
            .iter()
            .map(|p| format!("`{}` ({})", p.name, p.ty))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match port {
        Some(p) => match names.iter().position(|x| *x == p) {
            Some(k) => Ok((i, k)),
            None => Err(Some((
                format!("stage `{id}` ({}) has no {dir} port `{p}`", st.kind),
                if ports.is_empty() {
                    format!("`{}` has no {dir} ports", st.kind)
                } else {
                    match closest(p, &names) {
                        Some(c) => {
                            format!("did you mean `{id}.{c}`? its {dir} ports are: {}", listed())
                        }
                        None => format!("its {dir} ports are: {}", listed()),
                    }
                },
            ))),
        },
        None if ports.len() == 1 => Ok((i, 0)),
        None if ports.is_empty() => Err(Some((
            format!("stage `{id}` ({}) has no {dir} ports", st.kind),
            format!(
                "`{}` cannot be on the `{}` side of an edge",
                st.kind,
                if output { "from" } else { "to" }
            ),
        ))),
        None => Err(Some((
            format!(
                "`{id}` needs a port name: it has {} {dir} ports",
                ports.len()
            ),
            format!("write `{id}.PORT` with one of: {}", listed()),
        ))),
    }
}

/// Cycles must contain an edge marked `back_edge: true`. One diagnostic per
/// cycle, at the last edge (in file order) that closes it.
pub(super) fn check_cycles(
    stages: &[Option<PlannedStage>],
    edges: &[PlannedEdge],
    spec_index: &[usize],
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) {
    use petgraph::graph::DiGraph;
    let mut g = DiGraph::<usize, ()>::new();
    let nodes: Vec<_> = (0..stages.len()).map(|i| g.add_node(i)).collect();
    let forward: Vec<(usize, &PlannedEdge)> = edges
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.back_edge)
        .collect();
    for (_, e) in &forward {
        g.add_edge(nodes[e.from.0], nodes[e.to.0], ());
    }
    let name = |i: usize| stages[i].as_ref().map_or("?", |s| s.id.as_str());
    for scc in petgraph::algo::tarjan_scc(&g) {
        let members: HashSet<usize> = scc.iter().map(|n| g[*n]).collect();
        let Some(&(k, closing)) = forward
            .iter()
            .filter(|(_, e)| members.contains(&e.from.0) && members.contains(&e.to.0))
            .max_by_key(|(k, _)| *k)
        else {
            continue;
        };
        let path = path_between(&forward, closing.to.0, closing.from.0, &members);
        let mut cycle: Vec<&str> = vec![name(closing.from.0)];
        cycle.extend(path.iter().map(|&i| name(i)));
        diags.push(
            cx.diag(
                spec_index
                    .get(k)
                    .and_then(|&k| cx.map.item_pos(List::Edges, k)),
                format!("edge `{}`", closing.label),
                format!(
                    "the edges form a cycle {} with no declared back-edge (it could deadlock)",
                    cycle.join(" -> ")
                ),
                "mark the feedback edge with `back_edge: true` (and give it a dropping policy or \
             enough capacity), or remove it",
            ),
        );
    }
}

/// Stages on a shortest path `from -> ... -> to` inside `within` (inclusive).
fn path_between(
    forward: &[(usize, &PlannedEdge)],
    from: usize,
    to: usize,
    within: &HashSet<usize>,
) -> Vec<usize> {
    let mut prev: HashMap<usize, usize> = HashMap::new();
    let mut queue = VecDeque::from([from]);
    let mut seen = HashSet::from([from]);
    while let Some(u) = queue.pop_front() {
        if u == to {
            break;
        }
        for (_, e) in forward.iter().filter(|(_, e)| e.from.0 == u) {
            let v = e.to.0;
            if within.contains(&v) && seen.insert(v) {
                prev.insert(v, u);
                queue.push_back(v);
            }
        }
    }
    let mut path = vec![to];
    let mut at = to;
    while at != from {
        match prev.get(&at) {
            Some(&p) => {
                path.push(p);
                at = p;
            }
            None => break,
        }
    }
    path.reverse();
    path
}
