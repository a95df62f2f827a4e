//! The MutatingAdmissionPolicy: one policy for every template, whose JSONPatch adds what the
//! webhook adds (only what is missing, in the webhook's order), so that the API server injects
//! by itself; and its bindings, one per opt-in rule. Each template is read for every pod
//! ([`crate::export::read`]); a pod whose per-pod override the webhook would refuse is left to
//! the backstop (a match condition).

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::engine::config::Injector;
use crate::engine::context::Owned;
use crate::engine::fit;
use crate::engine::template::Fragment;
use crate::export::cel::{self, TOKEN_VOLUME};
use crate::export::objects::{
    ExportError, MutatingVersion, Selection, base_name, bindings, conditions, conflicts,
    match_constraints, metadata, read_all, refused, sidecars_by_template, windows_ok,
};
use crate::export::symbolic::{self, Exprs, Symbolic};

/// The MutatingAdmissionPolicy and its bindings: one policy for every template, so that what
/// it adds comes in the order the webhook adds it (the templates in the order the pod asks for
/// them), whatever the API server's order of policies; a policy per template could only be
/// ordered by name.
pub fn mutating(
    inj: &Injector,
    sel: &Selection,
    version: MutatingVersion,
) -> Result<Vec<Value>, ExportError> {
    let mut all = read_all(inj)?;
    let lists = list_variables(&mut all);
    let base = base_name(inj);
    let api = format!("admissionregistration.k8s.io/{}", version.as_str());
    let fragments: Vec<(String, Fragment)> = all
        .iter()
        .map(|(n, s)| (n.clone(), s.fragment.clone()))
        .collect();
    let windows_ok = windows_ok(&fragments);
    let hash = export_hash(&all);
    let mut ops: Vec<String> = Vec::new();
    let mut variables = variables(inj, &fragments, &windows_ok, &hash, &lists);
    // Before the sidecars added, which read it.
    if any_guaranteed_variant(&all) {
        let owned: Vec<&str> = inj
            .templates
            .owned()
            .sidecars
            .iter()
            .map(String::as_str)
            .collect();
        variables.push(json!({"name": "guaranteed", "expression": cel::guaranteed(&owned)}));
    }
    let (containers, inits) = targeting_ops(&all)?;
    ops.extend(containers);
    ops.extend(added_ops(&all)?);
    ops.extend(budget_ops(&all)?);
    ops.extend(inits);
    ops.extend(metadata_ops(inj, &all)?);
    let match_conditions = match_conditions(inj, &all, &fragments, &windows_ok);
    let mut docs = vec![json!({
        "apiVersion": api,
        "kind": "MutatingAdmissionPolicy",
        "metadata": metadata(inj, base.clone()),
        "spec": {
            // In-process: an error is a bug of the expressions; an opted-in pod is then refused
            // rather than stored without its sidecars.
            "failurePolicy": "Fail",
            // Containers another webhook or policy adds after this one get the mounts and env.
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": match_constraints(inj, &["CREATE"]),
            "matchConditions": match_conditions,
            "variables": variables,
            "mutations": [{
                "patchType": "JSONPatch",
                "jsonPatch": {"expression": ops.join("\n+ ")},
            }],
        },
    })];
    for (suffix, selectors) in bindings(inj, sel, false) {
        docs.push(json!({
            "apiVersion": api,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": metadata(inj, format!("{base}{suffix}")),
            "spec": {"policyName": base, "matchResources": selectors},
        }));
    }
    Ok(docs)
}

/// Each list a loop reads, computed once per pod: a variable for every distinct one, the
/// loops of `all` renamed to it. The lists, by variable number.
fn list_variables(all: &mut [(String, Symbolic)]) -> Vec<String> {
    let mut lists: Vec<String> = Vec::new();
    for (_, s) in all.iter_mut() {
        for l in &mut s.exprs.loops {
            let n = match lists.iter().position(|x| x == l) {
                Some(n) => n,
                None => {
                    lists.push(l.clone());
                    lists.len() - 1
                }
            };
            *l = format!("variables.list{n}");
        }
    }
    lists
}

/// Per template, the items of one field, as a CEL map from template name to list (objects
/// typed by `ty`); `None` when no template has any. A sidecar that a `Guaranteed` pod gets
/// otherwise ([`fit::guaranteed_sidecar`]) is both, chosen by `variables.guaranteed`.
fn by_template(
    all: &[(String, Symbolic)],
    field: &str,
    ty: &str,
) -> Result<Option<String>, ExportError> {
    let sidecars = matches!(field, "containers" | "initContainers");
    let mut entries = Vec::new();
    for (name, s) in all {
        let items = s
            .json
            .get(field)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if items.is_empty() {
            continue;
        }
        let value = |i: &Value| symbolic::value(i, ty, &s.exprs).map_err(|r| refused(name, r));
        let items: Vec<String> = items
            .iter()
            .map(|i| match guaranteed_variant(i).filter(|_| sidecars) {
                Some(g) => Ok(format!(
                    "(variables.guaranteed ? {} : {})",
                    value(&g)?,
                    value(i)?
                )),
                None => value(i),
            })
            .collect::<Result<_, _>>()?;
        entries.push(format!("{}: [{}]", cel::string(name), items.join(", ")));
    }
    Ok((!entries.is_empty()).then(|| format!("{{{}}}", entries.join(",\n  "))))
}

/// A sidecar as a `Guaranteed` pod gets it, when that differs.
fn guaranteed_variant(item: &Value) -> Option<Value> {
    let mut fitted = item.clone();
    fit::guaranteed_sidecar(&mut fitted);
    (fitted != *item).then_some(fitted)
}

/// Whether some sidecar differs in a `Guaranteed` pod (the policy then needs the class).
fn any_guaranteed_variant(all: &[(String, Symbolic)]) -> bool {
    all.iter().any(|(_, s)| {
        ["containers", "initContainers"].iter().any(|f| {
            s.json
                .get(*f)
                .and_then(Value::as_array)
                .is_some_and(|items| items.iter().any(|i| guaranteed_variant(i).is_some()))
        })
    })
}

/// The items of the templates injected (`map`, from [`by_template`]), in their order, each
/// once (the first of a name: `same`), leaving out those the pod has (`absent`).
fn in_order(map: &str, same: &str, absent: &str) -> String {
    format!(
        "[variables.injected.map(t, t in {map} ? {map}[t] : []).flatten()].map(all, all.transformList(j, m, !({absent}) && !all.slice(0, j).exists(y, {same}), m))[0]"
    )
}

/// Mounts and env, for each container of `list` that receives them (`guard`, over `c`): what
/// it lacks, in template order, appended (or the list created) at index `at` (over `i`).
fn container_ops(
    all: &[(String, Symbolic)],
    list: &str,
    pod_list: &str,
    at: &str,
    guard: &str,
) -> Result<Option<String>, ExportError> {
    let mut per = Vec::new();
    for (field, same, has) in [
        (
            "volumeMounts",
            "y.name == m.name || y.mountPath == m.mountPath",
            "has(c.volumeMounts) && c.volumeMounts.exists(y, y.name == m.name || y.mountPath == m.mountPath)",
        ),
        (
            "env",
            "y.name == m.name",
            "has(c.env) && c.env.exists(y, y.name == m.name)",
        ),
    ] {
        let ty = format!("Object.spec.{list}.{field}");
        if let Some(map) = by_template(all, field, &ty)? {
            let new = in_order(&map, same, has);
            per.push(format!(
                "[{new}].map(new, new.size() == 0 ? [] : (has(c.{field}) ? new.map(m, JSONPatch{{op: \"add\", path: \"/spec/{list}/\" + string({at}) + \"/{field}/-\", value: m}}) : [JSONPatch{{op: \"add\", path: \"/spec/{list}/\" + string({at}) + \"/{field}\", value: new}}]))[0]"
            ));
        }
    }
    Ok((!per.is_empty()).then(|| {
        format!(
            "{pod_list}.transformList(i, c, {guard}, {}).flatten()",
            per.join("\n    + ")
        )
    }))
}

/// The containers that receive the templates' mounts and env: every application container
/// (not a sidecar of the templates injected) or, when the pod names them
/// (`containersAnnotation`), those it names, init containers included; as the webhook.
fn targeting_ops(
    all: &[(String, Symbolic)],
) -> Result<(Option<String>, Option<String>), ExportError> {
    let containers = container_ops(
        all,
        "containers",
        "object.spec.containers",
        "i",
        "!(c.name in variables.sidecars) && (!variables.targeted || c.name in variables.targets)",
    )?;
    // The pod's own init containers come after those the policy places before them.
    let inits = container_ops(
        all,
        "initContainers",
        "(has(object.spec.initContainers) ? object.spec.initContainers : [])",
        "i + variables.initsAdded",
        "!(c.name in variables.sidecars) && variables.targeted && c.name in variables.targets",
    )?;
    Ok((containers, inits))
}

/// The sidecar containers and the volumes and image pull secrets the pod lacks, appended in
/// template order; the init containers, in template order, before the pod's own.
fn added_ops(all: &[(String, Symbolic)]) -> Result<Vec<String>, ExportError> {
    let mut ops = Vec::new();
    // Sidecar containers, appended in template order.
    if let Some(map) = by_template(all, "containers", "Object.spec.containers")? {
        let new = in_order(&map, "y.name == m.name", "m.name in variables.names");
        ops.push(format!(
            "{new}.map(s, JSONPatch{{op: \"add\", path: \"/spec/containers/-\", value: s}})"
        ));
    }
    // Init containers, in template order, before the pod's own.
    if let Some(map) = by_template(all, "initContainers", "Object.spec.initContainers")? {
        let new = in_order(&map, "y.name == m.name", "m.name in variables.names");
        ops.push(format!(
            "[{new}].map(new, new.size() == 0 ? [] : (has(object.spec.initContainers) ? new.transformList(k, s, JSONPatch{{op: \"add\", path: \"/spec/initContainers/\" + string(k), value: s}}) : [JSONPatch{{op: \"add\", path: \"/spec/initContainers\", value: new}}]))[0]"
        ));
    }
    for (field, ty) in [
        ("volumes", "Object.spec.volumes"),
        ("imagePullSecrets", "Object.spec.imagePullSecrets"),
    ] {
        if let Some(map) = by_template(all, field, ty)? {
            let new = in_order(
                &map,
                "y.name == m.name",
                &format!(
                    "has(object.spec.{field}) && object.spec.{field}.exists(y, y.name == m.name)"
                ),
            );
            ops.push(format!(
                "[{new}].map(new, new.size() == 0 ? [] : (has(object.spec.{field}) ? new.map(x, JSONPatch{{op: \"add\", path: \"/spec/{field}/-\", value: x}}) : [JSONPatch{{op: \"add\", path: \"/spec/{field}\", value: new}}]))[0]"
            ));
        }
    }
    Ok(ops)
}

/// The pod-level budget's cpu and memory amounts, each grown by what the sidecars added ask
/// for, as [`fit::grown_budget`] grows them: a sidecar of the templates injected that the pod
/// lacks counts its request (its limit where it sets none; its limit for limits), as a
/// `Guaranteed` pod gets it; summed as floats, written in millicores or with the largest exact
/// binary suffix, rounded half up, and only where some sidecar added sets the amount.
fn budget_ops(all: &[(String, Symbolic)]) -> Result<Vec<String>, ExportError> {
    // Each sidecar once (the first template that has it), with its JSON.
    let mut sidecars: Vec<(&str, &Symbolic, &Value)> = Vec::new();
    for (_, s) in all {
        for field in ["initContainers", "containers"] {
            for item in s
                .json
                .get(field)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let Some(n) = item.get("name").and_then(Value::as_str) else {
                    continue;
                };
                if !sidecars.iter().any(|(m, _, _)| *m == n) {
                    sidecars.push((n, s, item));
                }
            }
        }
    }
    let amount = |item: &Value, list: &str, res: &str| -> Option<Value> {
        let r = item.get("resources")?;
        let get = |l: &str| r.get(l).and_then(|m| m.get(res)).cloned();
        match list {
            "requests" => get("requests").or_else(|| get("limits")),
            _ => get("limits"),
        }
    };
    let mut ops = Vec::new();
    for list in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            let mut terms = Vec::new();
            let mut grew = Vec::new();
            for (n, s, item) in &sidecars {
                let fitted = guaranteed_variant(item).unwrap_or_else(|| (*item).clone());
                let expr = |v: Option<Value>| -> Result<Option<String>, ExportError> {
                    v.map(|v| symbolic::value(&v, "", &s.exprs).map_err(|r| refused(n, r)))
                        .transpose()
                };
                let (plain, fit) = (
                    expr(amount(item, list, res))?,
                    expr(amount(&fitted, list, res))?,
                );
                let (has, value) = match (plain, fit) {
                    (Some(p), Some(f)) if p == f => ("true".to_owned(), p),
                    (Some(p), Some(f)) => (
                        "true".to_owned(),
                        format!("(variables.guaranteed ? {f} : {p})"),
                    ),
                    (None, Some(f)) => ("variables.guaranteed".to_owned(), f),
                    (Some(p), None) => ("!variables.guaranteed".to_owned(), p),
                    (None, None) => continue,
                };
                let name = cel::string(n);
                let added = format!(
                    "({name} in variables.sidecars && !({name} in variables.names) && {has})"
                );
                terms.push(format!(
                    "({added} ? quantity({value}).asApproximateFloat() : 0.0)"
                ));
                grew.push(added);
            }
            if terms.is_empty() {
                continue;
            }
            let budget = format!("object.spec.resources.{list}");
            let total = format!(
                "quantity({budget}[\"{res}\"]).asApproximateFloat() + [{}].sum()",
                terms.join(", ")
            );
            let written = match res {
                "cpu" => format!(
                    "[int(({total}) * 1000.0 + 0.5)].map(m, m % 1000 == 0 ? string(m / 1000) : string(m) + \"m\")[0]"
                ),
                _ => {
                    let mut text = "string(b)".to_owned();
                    for (suffix, unit) in fit::BINARY_SUFFIXES.iter().rev() {
                        text = format!(
                            "(b % {unit} == 0 ? string(b / {unit}) + \"{suffix}\" : {text})"
                        );
                    }
                    format!("[int(({total}) + 0.5)].map(b, b != 0 ? {text} : \"0\")[0]")
                }
            };
            ops.push(format!(
                "((has(object.spec.resources) && has({budget}) && \"{res}\" in {budget} && ({})) ? [JSONPatch{{op: \"add\", path: \"/spec/resources/{list}/{res}\", value: {written}}}] : [])",
                grew.join(" || ")
            ));
        }
    }
    Ok(ops)
}

/// Labels and annotations the templates set, where the pod has none of that key (the first
/// template injected that sets a key gives its value), then the status.
fn metadata_ops(inj: &Injector, all: &[(String, Symbolic)]) -> Result<Vec<String>, ExportError> {
    let cfg = &inj.config;
    let mut ops = Vec::new();
    for map in ["labels", "annotations"] {
        let mut keys: std::collections::BTreeMap<&str, Vec<(&str, String)>> = Default::default();
        for (name, s) in all {
            let entries = s.json.get(map).and_then(Value::as_object);
            for (k, v) in entries.into_iter().flatten() {
                if map == "annotations" && *k == cfg.status_annotation {
                    continue;
                }
                let v = symbolic::text(v.as_str().unwrap_or_default(), &s.exprs)
                    .map_err(|r| refused(name, r))?;
                keys.entry(k.as_str()).or_default().push((name.as_str(), v));
            }
        }
        let mut each = Vec::new();
        for (k, setters) in &keys {
            let names = cel::strings(setters.iter().map(|(t, _)| *t));
            let values: Vec<String> = setters
                .iter()
                .map(|(t, v)| format!("{}: {v}", cel::string(t)))
                .collect();
            each.push(format!(
                "((variables.injected.exists(t, t in {names}) && !(has(object.metadata.{map}) && {key} in object.metadata.{map})) ? [JSONPatch{{op: \"add\", path: {path}, value: {{{values}}}[variables.injected.filter(t, t in {names})[0]]}}] : [])",
                key = cel::string(k),
                path = cel::string(&format!("/metadata/{map}/{}", cel::pointer_token(k))),
                values = values.join(", "),
            ));
        }
        if map == "annotations" {
            each.push(format!(
                "((has(object.metadata.annotations) && {key} in object.metadata.annotations) ? [] : [JSONPatch{{op: \"add\", path: {path}, value: variables.status}}])",
                key = cel::string(&cfg.status_annotation),
                path = cel::string(&format!("/metadata/annotations/{}", cel::pointer_token(&cfg.status_annotation))),
            ));
        }
        if each.is_empty() {
            continue;
        }
        // A pod without the map gets an empty one first, when an entry follows: the status
        // always does; a label only when a template that sets one is injected.
        let setters = cel::strings(keys.values().flatten().map(|(t, _)| *t));
        let create = match map {
            "annotations" => format!("!has(object.metadata.{map})"),
            _ => format!(
                "!has(object.metadata.{map}) && variables.injected.exists(t, t in {setters})"
            ),
        };
        ops.push(format!(
            "(({create}) ? [JSONPatch{{op: \"add\", path: \"/metadata/{map}\", value: {{}}}}] : [])\n+ {}",
            each.join("\n+ ")
        ));
    }
    Ok(ops)
}

/// The policy's variables: the templates asked for and injected, the pod's container names,
/// the sidecars of the templates injected, the status annotation, and each list a loop reads.
fn variables(
    inj: &Injector,
    fragments: &[(String, Fragment)],
    windows_ok: &[&str],
    hash: &str,
    lists: &[String],
) -> Vec<Value> {
    let owned = inj.templates.owned();
    let sidecars = sidecars_by_template(fragments);
    let targets = cel::string(&inj.config.containers_annotation);
    // The native sidecars of each template, for how many the policy places before the pod's
    // own init containers (homogeneous literals: "" stands for none and is left out).
    let inits: Vec<String> = fragments
        .iter()
        .map(|(name, f)| {
            let mut names: Vec<&str> = f.init_containers.iter().map(|c| c.name.as_str()).collect();
            names.push("");
            format!("{}: {}", cel::string(name), cel::strings(names))
        })
        .collect();
    let inits = format!("{{{}}}", inits.join(", "));
    let variables = vec![
        json!({"name": "asked", "expression": cel::asked(inj, true)}),
        json!({"name": "injected", "expression": cel::injected(inj, "variables.asked", windows_ok, &conflicts(fragments))}),
        json!({"name": "names", "expression": "object.spec.containers.map(c, c.name) + (has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : [])"}),
        json!({"name": "targeted", "expression": format!("has(object.metadata.annotations) && {targets} in object.metadata.annotations")}),
        json!({"name": "targets", "expression": format!("variables.targeted ? object.metadata.annotations[{targets}].split(\",\").map(n, n.trim()).filter(n, n != \"\") : []")}),
        json!({"name": "initsAdded", "expression": format!("variables.injected.map(t, {inits}[t]).flatten().filter(n, n != \"\" && !(n in variables.names)).distinct().size()")}),
        json!({"name": "sidecars", "expression": format!("variables.injected.map(t, {sidecars}[t]).flatten().filter(n, n != \"\")")}),
        json!({"name": "status", "expression": status_expr(inj, hash, owned)}),
    ];
    variables
        .into_iter()
        .chain(
            lists
                .iter()
                .enumerate()
                .map(|(n, l)| json!({"name": format!("list{n}"), "expression": l})),
        )
        .collect()
}

/// The match conditions: the webhook's skips, every template asked for known, every override
/// allowed, and some template injected.
fn match_conditions(
    inj: &Injector,
    all: &[(String, Symbolic)],
    fragments: &[(String, Fragment)],
    windows_ok: &[&str],
) -> Vec<Value> {
    let known = cel::strings(all.iter().map(|(n, _)| n.as_str()));
    let mut match_conditions = conditions(inj);
    match_conditions.push(json!({
        "name": "known-templates",
        "expression": format!("{}.all(n, n in {known})", cel::asked(inj, true)),
    }));
    if let Some(expression) = overrides_allowed(inj) {
        match_conditions.push(json!({"name": "overrides-allowed", "expression": expression}));
    }
    match_conditions.push(json!({
        "name": "injects-a-template",
        "expression": format!("{}.size() > 0", cel::injected(inj, &cel::asked(inj, true), windows_ok, &conflicts(fragments))),
    }));
    match_conditions
}

/// Whether every per-pod override the pod sets, of the templates it asks for, is allowed. A
/// mutating policy cannot refuse a pod as the webhook does; with this as a match condition it
/// leaves such a pod alone, and the backstop refuses it with the webhook's message.
fn overrides_allowed(inj: &Injector) -> Option<String> {
    let asked = cel::asked(inj, true);
    let each: Vec<String> = inj
        .templates
        .names()
        .filter_map(|name| {
            let checks = cel::override_checks(inj, name);
            (!checks.is_empty()).then(|| {
                let all: Vec<String> = checks
                    .iter()
                    .map(|c| format!("(!{} || {})", c.present, c.allowed))
                    .collect();
                format!(
                    "(!({} in {asked}) || ({}))",
                    cel::string(name),
                    all.join(" && ")
                )
            })
        })
        .collect();
    (!each.is_empty()).then(|| each.join(" && "))
}

/// The policy's stand-in for the status hash: CEL has no hash function, so the policy records
/// a digest of what it was exported from, the same for every pod.
fn export_hash(all: &[(String, Symbolic)]) -> String {
    let mut h = Sha256::new();
    for (name, s) in all {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(serde_json::to_vec(&s.json).unwrap_or_default());
        for e in s.exprs.markers.iter().chain(&s.exprs.loops) {
            h.update(e.as_bytes());
            h.update([0]);
        }
        for (k, e) in &s.exprs.iters {
            let (i, v) = Exprs::vars(*k);
            h.update(e.cel(&i, &v, "").as_bytes());
            h.update([0]);
        }
    }
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("policy-{hex}")
}

/// The status annotation the webhook writes, as CEL: the templates injected, the export's
/// hash, the sidecar names the pod brought itself, the revision and what of the pod the
/// rendering saw.
fn status_expr(inj: &Injector, hash: &str, owned: &Owned) -> String {
    let quoted = |list: &str| format!("{list}.map(n, \"\\\"\" + n + \"\\\"\").join(\",\")");
    let revision = match inj.config.revision.as_str() {
        "" => String::new(),
        r => format!(
            ",\"revision\":{}",
            serde_json::to_string(r).unwrap_or_default()
        ),
    };
    let sidecars = cel::strings(owned.sidecars.iter().map(String::as_str));
    let volumes = cel::strings(owned.volumes.iter().map(String::as_str));
    let seen_containers =
        format!("object.spec.containers.map(c, c.name).filter(n, !(n in {sidecars}))");
    let seen_inits = format!(
        "(has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : []).filter(n, !(n in {sidecars}))"
    );
    let seen_volumes = format!(
        "(has(object.spec.volumes) ? object.spec.volumes.filter(v, !(v.name in {volumes}) && !{TOKEN_VOLUME}).map(v, v.name) : [])"
    );
    let part = |key: &str, list: &str| {
        format!(
            "({list}.size() == 0 ? \"\" : \"\\\"{key}\\\":[\" + {} + \"]\")",
            quoted(list)
        )
    };
    let kept = "variables.sidecars.filter(n, n in variables.names)";
    format!(
        "\"{{\\\"templates\\\":[\" + {templates} + \"],\\\"hash\\\":\\\"{hash}\\\",\\\"config\\\":\\\"{config}\\\"\" + ({kept}.size() == 0 ? \"\" : \",\\\"kept\\\":[\" + {kept_list} + \"]\") + {revision} + \",\\\"context\\\":{{\" + [{c}, {i}, {v}].filter(p, p != \"\").join(\",\") + \"}}}}\"",
        templates = quoted("variables.injected"),
        config = inj.digest,
        kept_list = quoted(kept),
        revision = cel::string(&revision),
        c = part("containers", &seen_containers),
        i = part("initContainers", &seen_inits),
        v = part("volumes", &seen_volumes),
    )
}
