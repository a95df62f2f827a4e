//! The decision: whether and how a pod is injected, rendered once, with the notes a person
//! reads about it.

use std::sync::Arc;

use crate::engine::config::Injector;
use crate::engine::context::{Seen, Shown, Source};
use crate::engine::inject::facts::{Entry, PodFacts};
use crate::engine::inject::rules::{
    InjectError, SkipReason, malformed, opt_in, runs_to_completion, selected_templates, targets,
};
use crate::engine::inject::status::{Rendered, Status, fragment_hash, status_json};
use crate::engine::template::{Fragment, Overrides, Quoted};
use crate::engine::{fit, messages};

/// What the injector decided for a pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The pod does not carry the opt-in label with the value "true".
    NotOptedIn,
    /// The pod opted in but a rule says it is not injected.
    Skip(SkipReason),
    /// The pod gets these templates.
    Inject(Plan),
}

/// The templates a pod gets, rendered, and the status annotation describing them.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The rule that opted the pod in.
    pub entry: Entry,
    pub templates: Vec<Rendered>,
    /// Value of the status annotation, and its JSON.
    pub status: Arc<Quoted>,
    /// Templates left out (with the reason), reported as warnings.
    pub notes: Vec<String>,
}

/// Decides whether and how a pod is injected. Pure: the same pod and configuration always give
/// the same decision.
pub fn decide(inj: &Injector, facts: &PodFacts<'_>) -> Result<Decision, InjectError> {
    let cfg = &inj.config;
    let Ok(entry) = opt_in(inj, facts) else {
        return Ok(Decision::NotOptedIn);
    };
    if inj.is_excluded_namespace(facts.namespace) {
        return Ok(Decision::Skip(SkipReason::ExcludedNamespace(
            facts.namespace.to_owned(),
        )));
    }
    if let Some(what) = malformed(facts.pod) {
        return Ok(Decision::Skip(SkipReason::Malformed(what)));
    }
    let spec = facts.pod.spec.as_ref();
    if cfg.skip.host_network && spec.and_then(|s| s.host_network).unwrap_or(false) {
        return Ok(Decision::Skip(SkipReason::HostNetwork));
    }
    let names = selected_templates(inj, facts)?;
    let mut overrides = Vec::with_capacity(names.len());
    for name in &names {
        overrides.push(overrides_of(inj, facts, name)?);
    }
    let windows = cfg.skip.windows && facts.is_windows()?;
    let owned = &inj.templates.owned().sidecars;
    let guaranteed = fit::guaranteed(facts.pod, owned);
    let runs = |name: &str| facts.pod.has_container(name);
    let mut conflict = None;
    let mut render =
        |only: Option<&Seen>| -> Result<(Vec<Rendered>, Vec<String>, Shown<'_>), InjectError> {
            let shown = Shown::of(facts.pod, inj.templates.owned(), only)?;
            let source = facts.source(inj, &shown);
            let mut templates = Vec::with_capacity(names.len());
            let mut notes = Vec::new();
            for (name, overrides) in names.iter().zip(&overrides) {
                let fragment = render_one(inj, &source, name, overrides)?;
                if windows && !fragment.supports_windows {
                    notes.push(messages::not_for_windows(name));
                    continue;
                }
                if let Some(other) = fragment.conflicts_with.iter().find(|n| runs(n)) {
                    notes.push(messages::conflicts_with(name, other));
                    conflict.get_or_insert_with(|| other.clone());
                    continue;
                }
                let fragment = fitted(name, fragment, guaranteed, &mut notes);
                templates.push(Rendered {
                    name: (*name).to_owned(),
                    fragment,
                });
            }
            Ok((templates, notes, shown))
        };
    // An earlier rendering (the mutator's, seen again by a reinvocation or the validator) is
    // repeated from what it saw, so that what was added to the pod since does not change it.
    // Its status is trusted only if that reproduces it exactly.
    let previous = facts.status(inj);
    let mut again = None;
    if let Some((previous, context)) = previous
        .as_ref()
        .filter(|p| p.revision == cfg.revision)
        .and_then(|p| Some((p, p.context.as_ref()?)))
    {
        let (templates, notes, seen) = render(Some(context))?;
        let same = fragment_hash(inj, &templates) == previous.hash
            && templates
                .iter()
                .map(|t| &t.name)
                .eq(previous.templates.iter());
        if same {
            again = Some((templates, notes, seen));
        }
    }
    let (templates, mut notes, seen) = match again {
        Some(again) => again,
        None => render(None)?,
    };
    if templates.is_empty() && windows {
        return Ok(Decision::Skip(SkipReason::Windows));
    }
    if let (true, Some(container)) = (templates.is_empty(), conflict) {
        return Ok(Decision::Skip(SkipReason::Conflicts(container)));
    }
    let hash = fragment_hash(inj, &templates);
    let kept = kept_containers(facts, previous.as_ref(), &templates, &hash, &mut notes);
    let renderings = templates.iter().map(|t| (t, &*t.fragment));
    if let Some((t, clash)) = fit::port_clash(facts.pod, owned, renderings, |name| {
        kept.iter().any(|k| k == name)
    }) {
        return Err(InjectError::PortClash {
            template: t.name.clone(),
            clash: Box::new(clash),
            annotation: cfg.templates_annotation.clone(),
        });
    }
    completion_notes(facts, &templates, &kept, &mut notes);
    if let Some(targets) = targets(inj, facts.pod) {
        for name in targets
            .into_iter()
            .filter(|n| !runs(n) || owned.contains(*n))
        {
            notes.push(messages::target_missing(&cfg.containers_annotation, name));
        }
    }
    let status = status_json(inj, &templates, hash, kept, &cfg.revision, &seen);
    Ok(Decision::Inject(Plan {
        entry,
        templates,
        status,
        notes,
    }))
}

/// Template `name` rendered for the context `source` shows.
fn render_one(
    inj: &Injector,
    source: &Source<'_>,
    name: &str,
    overrides: &Overrides<'_>,
) -> Result<Arc<Fragment>, InjectError> {
    let reads = inj.templates.reads(name);
    let key = |start| source.key(reads, start);
    inj.templates.render_with(name, overrides, key, || {
        source.context().map_err(InjectError::Unread)
    })
}

/// The rendering a pod is given: for a `Guaranteed` pod its variant that keeps the pod's
/// class, with a note for each sidecar that cannot be made so.
fn fitted(
    name: &str,
    fragment: Arc<Fragment>,
    guaranteed: bool,
    notes: &mut Vec<String>,
) -> Arc<Fragment> {
    if !guaranteed {
        return fragment;
    }
    let fitted = fit::guaranteed_variant(&fragment);
    for (container, resource) in &fitted.unbounded {
        notes.push(fit::loses_guaranteed(name, container, resource));
    }
    Arc::clone(&fitted.fragment)
}

/// The templates `status` records, rendered again as the pod was given them: for the
/// containers and volumes the status's `context` says the rendering saw, with the pod's
/// overrides, fitted to a `Guaranteed` pod as [`decide`] fits them. `None` when they no
/// longer render what the status's hash says (another configuration, another namespace, an
/// override changed since). What `uninject` takes back out of a pod; opt-in, skip rules and
/// conflicts are not asked again: the status says the templates were given.
pub fn render_recorded(
    inj: &Injector,
    facts: &PodFacts<'_>,
    status: &Status,
) -> Result<Option<Vec<Rendered>>, InjectError> {
    let owned = inj.templates.owned();
    let guaranteed = fit::guaranteed(facts.pod, &owned.sidecars);
    let shown = Shown::of(facts.pod, owned, status.context.as_ref())?;
    let source = facts.source(inj, &shown);
    let mut templates = Vec::with_capacity(status.templates.len());
    for name in &status.templates {
        let overrides = overrides_of(inj, facts, name)?;
        let fragment = render_one(inj, &source, name, &overrides)?;
        templates.push(Rendered {
            name: name.clone(),
            fragment: fitted(name, fragment, guaranteed, &mut Vec::new()),
        });
    }
    Ok((fragment_hash(inj, &templates) == status.hash).then_some(templates))
}

/// The values the pod's annotations give template `name`'s overrides, each checked.
fn overrides_of<'i>(
    inj: &'i Injector,
    facts: &PodFacts<'_>,
    name: &str,
) -> Result<Overrides<'i>, InjectError> {
    inj.templates
        .overrides_for(name, facts.annotations())
        .map_err(|source| InjectError::BadOverride {
            template: name.to_owned(),
            source: Box::new(source),
        })
}

/// Sidecar names the pod brought itself. Decided when a template is first injected and carried
/// in the status annotation afterwards, so a reinvocation (which sees our own sidecars) agrees.
/// A status is trusted only if it describes exactly this rendering (same templates, same hash);
/// any other status (stale, copied, hand-written) is ignored and what exists now is kept.
fn kept_containers(
    facts: &PodFacts<'_>,
    previous: Option<&Status>,
    templates: &[Rendered],
    hash: &str,
    notes: &mut Vec<String>,
) -> Vec<String> {
    let previous = previous.filter(|p| {
        p.hash == hash
            && p.templates.len() == templates.len()
            && p.templates.iter().zip(templates).all(|(p, t)| *p == t.name)
    });
    let (before, kept_before): (&[String], &[String]) = match previous {
        Some(p) => (&p.templates, &p.kept),
        None => (&[], &[]),
    };
    let mut kept = Vec::new();
    for t in templates {
        let injected_before = before.contains(&t.name);
        for name in t.fragment.sidecar_names() {
            let keep = if injected_before {
                kept_before.iter().any(|k| k == name)
            } else {
                facts.pod.has_container(name)
            };
            if keep {
                if !injected_before {
                    notes.push(messages::sidecar_kept(name, &t.name));
                }
                kept.push(name.to_owned());
            }
        }
    }
    kept
}

/// A regular container added to a pod that runs to completion keeps it running after the
/// application ends: the pod never completes, nor does its Job. Such a sidecar is injected as
/// its template says (the template is the author's), with a note naming it, never silently.
fn completion_notes(
    facts: &PodFacts<'_>,
    templates: &[Rendered],
    kept: &[String],
    notes: &mut Vec<String>,
) {
    // Collected first, so that the pod's owner is read only when there is something to say
    // (collecting nothing allocates nothing).
    let regular: Vec<(&str, &str)> = templates
        .iter()
        .flat_map(|t| {
            t.fragment
                .containers
                .iter()
                .filter(|c| !kept.contains(&c.name))
                .map(move |c| (t.name.as_str(), c.name.as_str()))
        })
        .collect();
    if regular.is_empty() {
        return;
    }
    let Some(why) = runs_to_completion(facts) else {
        return;
    };
    for (template, container) in regular {
        notes.push(crate::engine::fit::regular_sidecar_in_finite_pod(
            template, container, &why,
        ));
    }
}
