//! The backstop: a ValidatingAdmissionPolicy holding what CEL can check of the validator's
//! contract, so that an opted-in pod the injector did not reach is refused with a message that
//! says so, whatever the webhooks' failure policies; and its bindings, one per opt-in rule.
//! It runs from Kubernetes 1.30, so it uses no list function of 1.34 (`flatten`, `distinct`).

use serde_json::{Value, json};

use crate::engine::config::{Injector, NAMESPACE_REQUIRED, ValidationMode};
use crate::engine::messages;
use crate::engine::template::Fragment;
use crate::export::cel;
use crate::export::markers;
use crate::export::objects::{
    ExportError, Selection, base_name, bindings, conditions, conflicts, match_constraints,
    metadata, refused, windows_ok,
};
use crate::export::read::read;
use crate::export::symbolic::Symbolic;

/// The ValidatingAdmissionPolicy and its bindings.
/// `images`: also refuse a sidecar whose image is not the one its template fixes. Off unless
/// asked: such a backstop must change in the same instant as the injector's configuration (a
/// reload, a rollout), or it refuses pods the injector injected with the other version.
pub fn backstop(inj: &Injector, sel: &Selection, images: bool) -> Result<Vec<Value>, ExportError> {
    let names: Vec<String> = inj.templates.names().map(str::to_owned).collect();
    if names.is_empty() {
        return Err(ExportError::NoTemplates);
    }
    let fragments = fragments(inj, &names)?;
    let refusals = override_refusals(inj, &names);
    let mut variables = variables(inj, &names, &fragments, images, refusals.as_deref());
    let mut validations = validations(inj, &names, refusals.is_some());
    if sel.namespace_required {
        required(inj, &mut variables, &mut validations);
    }
    let cfg = &inj.config;
    let base = base_name(inj);
    let action = match cfg.validation.mode {
        ValidationMode::Enforce => "Deny",
        ValidationMode::Warn => "Warn",
    };
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": metadata(inj, format!("{base}-backstop")),
        "spec": {
            // In-process: an error is a bug of the expressions, and a pod let through unchecked
            // is what the backstop exists to prevent.
            "failurePolicy": "Fail",
            "matchConstraints": match_constraints(inj, &["CREATE"]),
            "matchConditions": conditions(inj),
            "variables": variables,
            "validations": validations,
        },
    });
    let mut docs = vec![policy];
    for (suffix, selectors) in bindings(inj, sel, true) {
        docs.push(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": metadata(inj, format!("{base}-backstop{suffix}")),
            "spec": {
                "policyName": format!("{base}-backstop"),
                "validationActions": [action],
                "matchResources": selectors,
            },
        }));
    }
    Ok(docs)
}

/// Each template rendered for every pod or, where it cannot be, for the set's sample pod: the
/// backstop checks only what does not depend on the pod (names, lists, restart policy, images
/// without a value read of the pod).
fn fragments(inj: &Injector, names: &[String]) -> Result<Vec<(String, Fragment)>, ExportError> {
    let symbolic: Vec<(String, Option<Symbolic>)> = names
        .iter()
        .map(|n| (n.clone(), read(inj, n).ok()))
        .collect();
    let mut fragments = Vec::new();
    for (name, s) in &symbolic {
        let f = match s {
            Some(s) => s.fragment.clone(),
            None => sample_fragment(inj, name)?,
        };
        fragments.push((name.clone(), f));
    }
    Ok(fragments)
}

/// What the contract holds each injected template to, as CEL: the sidecars `missing` (lists
/// of names) and the `problems` (messages: a sidecar in the other list, without its restart
/// policy or its image; a volume missing; the status annotation missing).
fn contract(
    inj: &Injector,
    fragments: &[(String, Fragment)],
    images: bool,
) -> (Vec<String>, Vec<String>) {
    let cfg = &inj.config;
    let status = cel::string(&cfg.status_annotation);
    let mut missing = Vec::new();
    let mut problems = Vec::new();
    for (name, f) in fragments {
        let t = cel::string(name);
        let lists = [
            ("containers", &f.containers, "initContainers"),
            ("initContainers", &f.init_containers, "containers"),
        ];
        for (list, wanted, other) in lists {
            for c in wanted {
                let s = cel::string(&c.name);
                let guard = format!("{t} in variables.injected && !({s} in variables.kept)");
                missing.push(format!(
                    "({guard} && !({s} in variables.names)) ? [{}] : []",
                    cel::string(&messages::sidecar_of(&c.name, name))
                ));
                problems.push(format!(
                    "({guard} && {s} in variables.{other} && !({s} in variables.{list})) ? {} : \"\"",
                    cel::string(&messages::sidecar_in_wrong_list(&c.name, name, list, other))
                ));
                let found = format!(
                    "(has(object.spec.{list}) ? object.spec.{list} : []).exists(c, c.name == {s}"
                );
                if c.restart_policy.as_deref() == Some("Always") {
                    problems.push(format!(
                        "({guard} && {found} && (!has(c.restartPolicy) || c.restartPolicy != \"Always\"))) ? {} : \"\"",
                        cel::string(&messages::sidecar_not_native(&c.name, name))
                    ));
                }
                if let Some(image) = c
                    .image
                    .as_deref()
                    .filter(|i| images && !markers::symbolic(i))
                {
                    problems.push(format!(
                        "({guard} && {found} && (!has(c.image) || c.image != {}))) ? {} : \"\"",
                        cel::string(image),
                        cel::string(&messages::sidecar_image(&c.name, name, image))
                    ));
                }
            }
        }
        for v in &f.volumes {
            problems.push(format!(
                "({t} in variables.injected && !(has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == {s}))) ? {} : \"\"",
                cel::string(&messages::volume_missing(&v.name, name)),
                s = cel::string(&v.name),
            ));
        }
    }
    problems.push(format!(
        "(variables.injected.size() > 0 && !(has(object.metadata.annotations) && {status} in object.metadata.annotations)) ? {} : \"\"",
        cel::string(&messages::status_missing(&cfg.status_annotation))
    ));
    (missing, problems)
}

/// The policy's variables: whether the pod is held to this export's contract (`current`),
/// the templates it asks for, unknown and injected, its container names, the sidecars it
/// kept, the first override not allowed (with `refusals`), and what is missing or wrong.
fn variables(
    inj: &Injector,
    names: &[String],
    fragments: &[(String, Fragment)],
    images: bool,
    refusals: Option<&str>,
) -> Value {
    let status = cel::string(&inj.config.status_annotation);
    let windows_ok = windows_ok(fragments);
    let known = cel::strings(names.iter().map(String::as_str));
    let (missing, problems) = contract(inj, fragments, images);
    let kept = format!(
        "(has(object.metadata.annotations) && {status} in object.metadata.annotations && object.metadata.annotations[{status}].contains('\"kept\":[')) ? object.metadata.annotations[{status}].split('\"kept\":[')[1].split(']')[0].split(',').map(k, k.trim().replace('\"', '')) : [\"\"]"
    );
    // Held to this export's contract: a pod the injector never reached (no status), or one it
    // injected under this very configuration. A pod injected under another (a replica not yet
    // reloaded, or already reloaded while this policy is replaced) needs only its status: a
    // stale backstop never refuses what the running configuration injected.
    let current = format!(
        "!(has(object.metadata.annotations) && {status} in object.metadata.annotations) || object.metadata.annotations[{status}].contains({})",
        cel::string(&format!("\"config\":\"{}\"", inj.digest))
    );
    let mut variables = json!([
        {"name": "current", "expression": current},
        {"name": "asked", "expression": cel::asked(inj, false)},
        {"name": "unknown", "expression": format!("variables.current ? variables.asked.filter(n, !(n in {known})) : []")},
        {"name": "injected", "expression": cel::injected(inj, "variables.asked", &windows_ok, &conflicts(fragments))},
        {"name": "containers", "expression": "has(object.spec.containers) ? object.spec.containers.map(c, c.name) : []"},
        {"name": "initContainers", "expression": "has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : []"},
        {"name": "names", "expression": "variables.containers + variables.initContainers"},
        {"name": "kept", "expression": kept},
        {"name": "clash", "expression": format!("variables.current ? {} : \"\"", port_clash(inj, fragments))},
        {"name": "missing", "expression": format!("variables.current ? ({}).filter(m, m != \"\") : []", join_or_empty(&missing))},
        {"name": "problems", "expression": format!("variables.current ? [{}].filter(p, p != \"\") : []", problems.join(",\n"))},
    ]);
    if let (Some(chain), Some(list)) = (refusals, variables.as_array_mut()) {
        list.insert(
            3,
            json!({"name": "overrides", "expression": format!("variables.current ? variables.asked.map(t, {chain}).filter(m, m != \"\") : []")}),
        );
    }
    variables
}

const NAME_EXPR: &str = "(has(object.metadata.name) && object.metadata.name != \"\" ? object.metadata.name : (has(object.metadata.generateName) ? object.metadata.generateName + \"*\" : \"\"))";

/// The policy's validations, each with the webhook's message: an unknown template, the first
/// override not allowed (with `overrides`), sidecars missing, other problems.
fn validations(inj: &Injector, names: &[String], overrides: bool) -> Value {
    let cfg = &inj.config;
    // After an unknown template, the webhook refuses the first override not allowed; the
    // other checks wait for both to pass, so that the pod gets one message.
    let refused = match overrides {
        true => "variables.unknown.size() > 0 || variables.overrides.size() > 0 || ",
        false => "variables.unknown.size() > 0 || ",
    };
    let after = format!("{refused}variables.clash != \"\" || ");
    let mut validations = json!([
        {
            "expression": "variables.unknown.size() == 0",
            "messageExpression": format!(
                "\"pod \" + {NAME_EXPR} + \": annotation {} names template(s) \" + variables.unknown.join(\", \") + \" that do not exist (known templates: {})\"",
                cfg.templates_annotation, names.join(", ")
            ),
            "reason": "Invalid",
        },
        {
            "expression": format!("{refused}variables.clash == \"\""),
            "messageExpression": "\"sidecar-injector: \" + variables.clash",
            "reason": "Invalid",
        },
        {
            "expression": format!("{after}variables.missing.size() == 0"),
            "messageExpression": format!(
                "\"pod \" + {NAME_EXPR} + \" lacks its sidecar(s) \" + variables.missing.join(\", \") + \": the sidecar injector did not run for it (is it down, or its webhook unreachable?). Create the pod again once the injector is running; `kubectl get pods -n <injector namespace>` shows it.\""
            ),
            "reason": "Invalid",
        },
        {
            "expression": format!("{after}variables.missing.size() > 0 || variables.problems.size() == 0"),
            "messageExpression": format!("\"pod \" + {NAME_EXPR} + \": \" + variables.problems.join(\"; \")"),
            "reason": "Invalid",
        },
    ]);
    if let (true, Some(list)) = (overrides, validations.as_array_mut()) {
        list.insert(
            1,
            json!({
                "expression": "variables.unknown.size() > 0 || variables.overrides.size() == 0",
                "messageExpression": "variables.overrides[0]",
                "reason": "Invalid",
            }),
        );
    }
    validations
}

/// What a namespace labelled `<injectLabel>: required` adds (its binding selects the pods that
/// opt out too): a pod that says `"false"` there is held to nothing else (`current` is false
/// for it) and is refused first, with the validator's words, unless its service account is
/// exempt (`required.exempt`) or it would get no template anyway. Who is exempt in each namespace the configuration names, and
/// in every other, is written out here, so the message lists them as the validator does.
fn required(inj: &Injector, variables: &mut Value, validations: &mut Value) {
    let cfg = &inj.config;
    let label = cel::string(&cfg.inject_label);
    let exempt = &cfg.required;
    let mut named: Vec<&str> = exempt
        .exempt
        .iter()
        .filter_map(|e| e.split_once('/').map(|(ns, _)| ns))
        .filter(|ns| *ns != "*")
        .collect();
    named.sort_unstable();
    named.dedup();
    let here: Vec<String> = named
        .iter()
        .map(|ns| {
            format!(
                "{}: {}",
                cel::string(ns),
                cel::string(&messages::listed(&exempt.exempt_in(ns)))
            )
        })
        .collect();
    let elsewhere = cel::string(&messages::listed(&exempt.exempt_in("*")));
    let listed = match here.is_empty() {
        true => elsewhere,
        false => {
            let here = format!("{{{}}}", here.join(", "));
            format!("(request.namespace in {here} ? {here}[request.namespace] : {elsewhere})")
        }
    };
    let entries = cel::strings(exempt.exempt.iter().map(String::as_str));
    let exempt = match exempt.is_empty() {
        true => "false".to_owned(),
        false => format!(
            "(request.namespace + \"/\" + variables.serviceAccount) in {entries} || (\"*/\" + variables.serviceAccount) in {entries}"
        ),
    };
    let text = messages::required_opt_out(
        "@P@",
        &cfg.inject_label,
        NAMESPACE_REQUIRED,
        "@N@",
        "@S@",
        "@E@",
    );
    let mut message = cel::string(&text);
    for (marker, expr) in [
        ("@P@", QUOTED_NAME_EXPR.to_owned()),
        ("@N@", "request.namespace".to_owned()),
        ("@S@", "variables.serviceAccount".to_owned()),
        ("@E@", "variables.exemptHere".to_owned()),
    ] {
        message = message.replace(marker, &format!("\" + {expr} + \""));
    }
    let added = [
        json!({"name": "required", "expression": format!("has(namespaceObject.metadata.labels) && {label} in namespaceObject.metadata.labels && namespaceObject.metadata.labels[{label}] == {}", cel::string(NAMESPACE_REQUIRED))}),
        json!({"name": "optedOut", "expression": format!("variables.required && has(object.metadata.labels) && {label} in object.metadata.labels && object.metadata.labels[{label}] == \"false\"")}),
        json!({"name": "serviceAccount", "expression": "has(object.spec.serviceAccountName) && object.spec.serviceAccountName != \"\" ? object.spec.serviceAccountName : \"default\""}),
        json!({"name": "exempt", "expression": exempt}),
        json!({"name": "exemptHere", "expression": listed}),
    ];
    if let Some(list) = variables.as_array_mut() {
        if let Some(current) = list
            .iter_mut()
            .find(|v| v["name"] == "current")
            .and_then(|v| v.get_mut("expression"))
        {
            *current = format!(
                "!variables.optedOut && ({})",
                current.as_str().unwrap_or("true")
            )
            .into();
        }
        for (i, v) in added.into_iter().enumerate() {
            list.insert(i, v);
        }
    }
    if let Some(list) = validations.as_array_mut() {
        list.insert(
            0,
            json!({
                // A pod that gets no template anyway (Windows, another mesh's proxy) is let by,
                // as the webhook lets it by (`rules::skipped_anyway`).
                "expression": "!variables.optedOut || variables.exempt || variables.injected.size() == 0",
                "messageExpression": message,
                "reason": "Forbidden",
            }),
        );
    }
}

/// The pod's name as the validator quotes it: `"web"`, `"web-"*` for one still to be named.
const QUOTED_NAME_EXPR: &str = "(has(object.metadata.name) && object.metadata.name != \"\" ? \"\\\"\" + object.metadata.name + \"\\\"\" : (has(object.metadata.generateName) ? \"\\\"\" + object.metadata.generateName + \"\\\"*\" : \"(unnamed)\"))";

/// The webhook's refusal of the first override not allowed, for template `t` (CEL, a name the
/// pod asks for): `""` when there is none.
fn override_refusals(inj: &Injector, names: &[String]) -> Option<String> {
    let mut chain = String::from("\"\"");
    let mut any = false;
    for name in names.iter().rev() {
        let checks = cel::override_checks(inj, name);
        if checks.is_empty() {
            continue;
        }
        any = true;
        let mut first = String::from("\"\"");
        for c in checks.iter().rev() {
            first = format!(
                "(({} && !({})) ? {} : {first})",
                c.present, c.allowed, c.message
            );
        }
        chain = format!("(t == {} ? {first} : {chain})", cel::string(name));
    }
    any.then_some(chain)
}

/// The webhook's refusal of a sidecar port that one of the pod's own containers declares too
/// (`InjectError::PortClash`), as CEL over the injected pod: the first clash of the sidecars of
/// the templates injected (not kept), native ones first, each list in the pod's order, as the
/// webhook looks for it; `""` when there is none.
fn port_clash(inj: &Injector, fragments: &[(String, Fragment)]) -> String {
    let mut owned: Vec<&str> = Vec::new();
    let mut template_of = Vec::new();
    for (name, f) in fragments {
        for sidecar in f.sidecar_names() {
            if !owned.contains(&sidecar) {
                owned.push(sidecar);
                template_of.push(format!("{}: {}", cel::string(sidecar), cel::string(name)));
            }
        }
    }
    if owned.is_empty() {
        return "\"\"".into();
    }
    let owned = cel::strings(owned);
    let template_of = format!("{{{}}}", template_of.join(", "));
    let proto = |p: &str| format!("(has({p}.protocol) ? {p}.protocol : \"TCP\")");
    let matches = format!(
        "!(o.name in {owned}) && has(o.ports) && o.ports.exists(q, q.containerPort == p.containerPort && {} == {})",
        proto("q"),
        proto("p")
    );
    let others = format!(
        "(object.spec.containers.filter(o, {matches}).map(o, o.name) + (has(object.spec.initContainers) ? object.spec.initContainers.filter(o, {matches}).map(o, o.name) : []))"
    );
    // The webhook's words, the values between them read of the pod.
    let text = messages::port_clash(
        "@T@",
        "@S@",
        "@P@",
        "@R@",
        "@C@",
        &inj.config.templates_annotation,
    );
    let mut message = cel::string(&text);
    for (marker, expr) in [
        ("@T@", format!("{template_of}[s.name]")),
        ("@S@", "s.name".to_owned()),
        ("@P@", "string(p.containerPort)".to_owned()),
        ("@R@", proto("p")),
        ("@C@", format!("{others}[0]")),
    ] {
        message = message.replace(marker, &format!("\" + {expr} + \""));
    }
    let clashes = |list: &str| {
        format!(
            "(has(object.spec.{list}) ? object.spec.{list} : []).filter(s, s.name in {template_of} && {template_of}[s.name] in variables.injected && !(s.name in variables.kept) && has(s.ports)).map(s, s.ports.filter(p, {others}.size() > 0).map(p, {message}))"
        )
    };
    format!(
        "[({} + {}).filter(l, l.size() > 0)].map(all, all.size() > 0 ? all[0][0] : \"\")[0]",
        clashes("initContainers"),
        clashes("containers")
    )
}

/// Lists joined with `+` (no `flatten()`: a list function of Kubernetes 1.34+, and the
/// backstop runs from 1.30).
fn join_or_empty(items: &[String]) -> String {
    if items.is_empty() {
        "[\"\"]".into()
    } else {
        items
            .iter()
            .map(|i| format!("({i})"))
            .collect::<Vec<_>>()
            .join("\n+ ")
    }
}

/// A template that cannot be read for every pod, rendered for the set's sample pod: its names,
/// lists and restart policies do not depend on the pod (the set checks that when it loads).
fn sample_fragment(inj: &Injector, name: &str) -> Result<Fragment, ExportError> {
    inj.templates
        .sample(name)
        .map(|f| (*f).clone())
        .map_err(|e| refused(name, e))
}
