//! Reading a template for every pod at once: what it renders, with each value it reads of the
//! pod kept as a CEL expression over the admission request ([`Symbolic`]).
//!
//! The template's syntax tree says where it reads the pod (`pod.*`, `overrides`): the walk
//! (`walk.rs`) translates each `{{ ... }}` that does to CEL (`translate.rs`) and
//! replaces it, in a copy of the source, by a marker string; the copy is rendered by the set's
//! own environment and read as a fragment, so every constant part is exactly what the webhook
//! renders. Loops over the pod's lists, and lists a template collects from them in a
//! `namespace()`, become CEL lists ([`super::loops`]). A read that changes the fragment's shape
//! in another way (a condition on the pod outside a loop, a value kept in a variable) cannot
//! become a JSONPatch value and is refused with its line. Then the rendering is tried again
//! with awkward values in place of each marker (`trials.rs`): a value the webhook's YAML
//! would read as another type or another structure is refused too, so that what the policy
//! writes (always the string the CEL expression gives) is what the webhook writes.

use minijinja::machinery::WhitespaceConfig;
use minijinja::machinery::ast::Stmt;
use minijinja::syntax::SyntaxConfig;

use crate::engine::config::Injector;
use crate::engine::template::TEMPLATE_SUFFIX;
use crate::export::loops;
use crate::export::symbolic::{Exprs, Refusal, Symbolic};
use crate::export::trials::{self, Renderer};
use crate::export::walk::{self, Walked};

/// Reads template `name` of `inj` for every pod.
pub fn read(inj: &Injector, name: &str) -> Result<Symbolic, Vec<Refusal>> {
    let whole = |reason: String| vec![Refusal::whole(reason)];
    let source = inj
        .templates
        .source(name)
        .ok_or_else(|| whole(format!("there is no template {name:?}")))?;
    let file = format!("{name}{TEMPLATE_SUFFIX}");
    let tree = parse(&file, source).map_err(whole)?;
    let walked = walk::walk(inj, name, source, &tree)?;
    let renderer = Renderer::new(inj, name, source, &walked);
    let fragment = renderer.once()?;
    let base = serde_json::to_value(&fragment).unwrap_or_default();
    let renders = renderer.per_loop(base.clone())?;
    let json = loops::build(&renders, &trials::iters_of(&walked))
        .map_err(|m| vec![walked.loop_refusal(m.k, m.error.to_string())])?;
    renderer.try_values(&fragment, &base, &json)?;
    renderer.try_lists(&json)?;
    let Walked {
        emits,
        iters,
        loops,
        ..
    } = walked;
    Ok(Symbolic {
        fragment,
        json,
        exprs: Exprs {
            markers: emits.into_iter().map(|e| e.cel.text).collect(),
            iters,
            loops: loops.into_iter().map(|l| l.cel).collect(),
        },
    })
}

/// The template's syntax tree, as the set's environment reads it (trailing newline kept).
fn parse<'s>(file: &'s str, source: &'s str) -> Result<Stmt<'s>, String> {
    let whitespace = WhitespaceConfig {
        keep_trailing_newline: true,
        ..WhitespaceConfig::default()
    };
    minijinja::machinery::parse(source, file, SyntaxConfig, whitespace)
        .map_err(|e| format!("does not parse: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::template::Fragment;
    use crate::export::markers::{self, LOOP_KEY, marker};
    use crate::export::symbolic::text;
    use serde_json::Value;

    /// The marker numbers a fragment holds.
    fn markers(f: &Fragment) -> std::collections::BTreeSet<usize> {
        fn walk(v: &Value, out: &mut std::collections::BTreeSet<usize>) {
            match v {
                Value::String(s) => {
                    out.extend(markers::pieces(s).into_iter().filter_map(|p| p.err()))
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
                Value::Object(o) => o.values().for_each(|v| walk(v, out)),
                _ => {}
            }
        }
        let mut out = std::collections::BTreeSet::new();
        walk(&serde_json::to_value(f).unwrap_or_default(), &mut out);
        out
    }

    fn injector(template: &str) -> Injector {
        Injector::from_sources(
            "test",
            "defaultTemplates: [t]\nvalues: {image: x:1}\n",
            vec![("t".into(), template.into())],
            None,
        )
        .expect("the template loads")
    }

    fn refusals(template: &str) -> Vec<Refusal> {
        read(&injector(template), "t").expect_err("refused")
    }

    const HEAD: &str = "containers:\n  - name: s\n    image: {{ values.image }}\n";

    #[test]
    fn metadata_reads_become_cel_and_constants_stay() {
        let src = format!(
            "{HEAD}    args:\n      - tag={{{{ pod.namespace }}}}.{{{{ pod.labels.app | default(\"pod\") }}}}\n      - {{{{ pod.annotations[\"a/b\"] | default(\"none\") | tojson }}}}\n"
        );
        let s = read(&injector(&src), "t").expect("exports");
        let c = &s.fragment.containers[0];
        assert_eq!(c.image.as_deref(), Some("x:1"), "constants are rendered");
        let args = c.args.as_deref().unwrap_or_default();
        assert_eq!(args[0], format!("tag={}.{}", marker(0), marker(1)));
        assert_eq!(args[1], marker(2));
        assert_eq!(s.exprs.markers[0], "request.namespace");
        assert!(
            s.exprs.markers[1].contains("object.metadata.labels[\"app\"]")
                && s.exprs.markers[1].ends_with(": \"pod\")"),
            "{}",
            s.exprs.markers[1]
        );
        assert!(
            s.exprs.markers[2].contains("object.metadata.annotations[\"a/b\"]"),
            "{}",
            s.exprs.markers[2]
        );
        assert_eq!(markers(&s.fragment).len(), 3);
    }

    #[test]
    fn a_loop_over_a_map_or_a_condition_on_the_pod_is_refused_with_its_line() {
        let src = format!(
            "{HEAD}{{% for k in pod.labels %}}\n{{% endfor %}}\n{{% if pod.labels.x is defined %}}\n{{% endif %}}\n"
        );
        let r = refusals(&src);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!((r[0].line, r[0].construct.as_str()), (4, "pod.labels"));
        assert!(
            r[0].reason.contains("can be looped over in CEL"),
            "{}",
            r[0]
        );
        assert_eq!(r[1].line, 6);
        assert!(r[1].reason.contains("a condition"), "{}", r[1]);
    }

    /// The bundled proxy's shape: TCP ports collected each once, then looped over in a string
    /// (with `loop.first` and an `else`) and in a list of variable length.
    const PORTS: &str = "{%- set app = namespace(ports=[]) %}\n{%- for c in pod.spec.containers %}\n{%- for p in c.ports | default([]) %}\n{%- if (p.protocol | default(\"TCP\")) == \"TCP\" and p.containerPort not in app.ports %}\n{%- set app.ports = app.ports + [p.containerPort] %}\n{%- endif %}\n{%- endfor %}\n{%- endfor %}\ninitContainers:\n  - name: s\n    image: x:1\n    args:\n      - >-\n        [{%- for port in app.ports %}{% if not loop.first %},{% endif %}\n        {\"p\":{{ port }},\"at\":{{ 100 + loop.index0 }}}\n        {%- else %}\n        \"none\"\n        {%- endfor %}]\n    ports:\n    {%- for port in app.ports %}\n      - name: p-{{ port }}\n        containerPort: {{ 100 + loop.index0 }}\n    {%- else %}\n      - name: p\n        containerPort: 100\n    {%- endfor %}\n";

    #[test]
    fn collected_ports_become_one_cel_list_looped_over_in_text_and_in_a_list() {
        let s = read(&injector(PORTS), "t").expect("exports");
        assert_eq!(s.exprs.loops.len(), 2);
        let list = &s.exprs.loops[0];
        assert_eq!(list, &s.exprs.loops[1], "the same list");
        assert!(
            list.starts_with("object.spec.containers.filter(c, !(c.name in [\"s\"]))")
                && list.contains("(has(a0.ports) ? a0.ports : [])")
                && list.contains("(has(a1.protocol) ? a1.protocol : \"TCP\") == \"TCP\"")
                && list.ends_with(".flatten().distinct()"),
            "{list}"
        );
        let arg = s.json["initContainers"][0]["args"][0]
            .as_str()
            .unwrap_or_default();
        assert!(
            arg.contains(markers::LOOP_OPEN) && arg.contains(markers::LOOP_ELSE),
            "{arg:?}"
        );
        let ports = &s.json["initContainers"][0]["ports"][0];
        assert_eq!(ports[LOOP_KEY], 1, "{ports}");
        assert_eq!(ports["else"][0]["containerPort"], 100);
        // The port is an int in the list, a decimal in the text.
        let exprs = &s.exprs;
        let int = ports["each"][0]["containerPort"]
            .as_str()
            .unwrap_or_default();
        let j: usize = int
            .trim_matches([markers::INT, markers::CLOSE])
            .parse()
            .expect("a marker");
        assert_eq!(exprs.iter(j, false), Ok("(100 + li1)".into()));
        assert_eq!(exprs.iter(j, true), Ok("string((100 + li1))".into()));
        let cel = text(arg, exprs).expect("CEL");
        assert!(
            cel.contains(&format!(
                "{list}.size() == 0 ? \" \\\"none\\\"\" : {list}.transformList(li0, lv0, "
            )),
            "{cel}"
        );
        assert!(cel.contains("(!(li0 == 0) ? \",\" : \"\")"), "{cel}");
    }

    #[test]
    fn what_cel_cannot_repeat_is_refused_with_its_line() {
        // A loop inside a loop over the pod's lists.
        let nested = format!(
            "{HEAD}    args:\n{{%- for c in pod.spec.containers %}}{{% for x in [1, 2] %}}\n      - {{{{ c.name | tojson }}}}\n{{%- endfor %}}{{% endfor %}}\n"
        );
        let r = refusals(&nested);
        assert!(r[0].reason.contains("a loop inside a loop"), "{r:?}");
        // A field templates do not see (env is not part of the context).
        let env = format!(
            "{HEAD}    args:\n{{%- for c in pod.spec.containers %}}\n      - {{{{ c.securityContext | default(\"x\") | tojson }}}}\n{{%- endfor %}}\n"
        );
        let r = refusals(&env);
        assert!(r[0].reason.contains("not a field templates see"), "{r:?}");
        // An append guarded by `not in` together with one that is not.
        let mixed = PORTS.replace(
            "{%- endfor %}\n{%- endfor %}\ninitContainers",
            "{%- set app.ports = app.ports + [p.containerPort] %}\n{%- endfor %}\n{%- endfor %}\ninitContainers",
        );
        let r = refusals(&mixed);
        assert!(r[0].reason.contains("both with and without"), "{r:?}");
    }

    #[test]
    fn overrides_are_read_from_the_annotation_or_the_default_and_tried_with_what_is_allowed() {
        let src = "{#- overrides:\n  a/level: {type: string, allowed: [info, \"off\"], default: info}\n  a/cpu: {type: cpu, max: 2, default: 50m}\n  a/n: {type: integer, min: 1, max: 5, default: 2}\n-#}\ncontainers:\n  - name: s\n    image: x:1\n    args: [{{ overrides[\"a/level\"] | tojson }}, \"n={{ overrides[\"a/n\"] }}\"]\n    resources:\n      requests:\n        cpu: {{ overrides[\"a/cpu\"] | tojson }}\n";
        let inj = Injector::from_sources(
            "test",
            "defaultTemplates: [t]\n",
            vec![("t".into(), src.into())],
            None,
        )
        .expect("loads");
        let s = read(&inj, "t").expect("exports");
        assert_eq!(
            s.exprs.markers[0],
            "((has(object.metadata.annotations) && \"a/level\" in object.metadata.annotations) ? object.metadata.annotations[\"a/level\"] : \"info\")"
        );
        assert!(
            s.exprs.markers[1].ends_with(": \"2\")"),
            "{}",
            s.exprs.markers[1]
        );
        // Unquoted, a whole number of cores is a YAML integer, which the fragment reads back
        // as the same quantity: tried with `1` and `2`, it exports too.
        let bare = src.replace(
            "cpu: {{ overrides[\"a/cpu\"] | tojson }}",
            "cpu: {{ overrides[\"a/cpu\"] }}",
        );
        let inj = Injector::from_sources(
            "test",
            "defaultTemplates: [t]\n",
            vec![("t".into(), bare)],
            None,
        )
        .expect("loads");
        read(&inj, "t").expect("exports");
        // A value that is not a string where the YAML needs one is refused, with the value.
        let level = src.replace(
            "args: [{{ overrides[\"a/level\"] | tojson }}",
            "args: [{{ overrides[\"a/level\"] }}",
        );
        let level = level.replace("[info, \"off\"]", "[info, \"[1]\"]");
        let inj = Injector::from_sources(
            "test",
            "defaultTemplates: [t]\n",
            vec![("t".into(), level)],
            None,
        )
        .expect("loads");
        let r = read(&inj, "t").expect_err("refused");
        assert!(r[0].reason.contains("where it is \"[1]\""), "{r:?}");
    }

    #[test]
    fn a_variable_set_from_the_pod_or_the_spec_is_refused() {
        let r = refusals(&format!("{{% set n = pod.name %}}\n{HEAD}"));
        assert!(r[0].reason.contains("kept in a variable"), "{}", r[0]);
        let r = refusals(&format!(
            "{HEAD}    workingDir: /{{{{ pod.spec.containers[0].name }}}}\n"
        ));
        assert!(r[0].reason.contains("spec"), "{}", r[0]);
        assert_eq!(r[0].line, 4);
    }

    #[test]
    fn a_value_whose_yaml_type_depends_on_the_pod_is_refused() {
        // A label "1.5" would be a number, "true" a boolean: the policy always writes a string.
        let r = refusals(&format!(
            "{HEAD}    env:\n      - name: V\n        value: {{{{ pod.labels.v | default(\"x\") }}}}\n"
        ));
        assert_eq!(r[0].line, 6);
        assert!(r[0].reason.contains("tojson"), "{}", r[0]);
        // Quoted with tojson, it exports.
        let ok = format!(
            "{HEAD}    env:\n      - name: V\n        value: {{{{ pod.labels.v | default(\"x\") | tojson }}}}\n"
        );
        read(&injector(&ok), "t").expect("exports");
    }

    #[test]
    fn an_annotation_in_plain_yaml_is_refused_as_it_may_hold_a_colon() {
        let r = refusals(&format!(
            "{HEAD}    args: [\"--x={{{{ pod.annotations.a | default(\"\") }}}}\"]\n"
        ));
        assert!(
            r[0].reason.contains("would not read it as that string"),
            "{}",
            r[0]
        );
    }

    #[test]
    fn a_name_read_from_the_pod_is_refused() {
        // The set checks names against two sample pods; a label neither sample has keeps the
        // name the same for both, so only the exporter can tell.
        let src = "containers:\n  - name: s-{{ pod.labels.zz | default(\"a\") }}\n    image: x:1\n";
        let r = refusals(src);
        assert!(r[0].reason.contains("container's name"), "{}", r[0]);
    }
}
