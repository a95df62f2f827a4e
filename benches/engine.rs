//! Engine cost as pods grow: `review::answer` for the mutating webhook, in process, on prepared
//! AdmissionReview bodies (the typical pod of `bench/review.json`, then the same pod with its
//! first container's env replaced by 10 … 10,000 variables, and with 2,000 in each of its two
//! containers). Timing only: nothing here asserts on time. `typical_memo` is the typical pod
//! again with another uid and token volume name each time, answered by the server's memory of
//! answers (`memo::Memo`), as a rollout's replicas are.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use sidecar_injector::config::Injector;
use sidecar_injector::inject::Entry;
use sidecar_injector::memo::{Memo, Recall};
use sidecar_injector::review::{self, Outcome, Webhook};

const REVIEW: &str = include_str!("../bench/review.json");

/// `count` env vars, mostly plain values, every tenth from a secret (as real pods mix them).
fn env_vars(container: usize, count: usize) -> Value {
    (0..count)
        .map(|i| {
            let name = format!("C{container}_VAR_{i:05}");
            if i % 10 == 9 {
                json!({"name": name, "valueFrom": {"secretKeyRef": {"name": "app-secrets", "key": format!("key-{i}")}}})
            } else {
                json!({"name": name, "value": format!("value-{i}-of-{count}")})
            }
        })
        .collect()
}

/// The typical review, with the env of container `i` replaced by `env[i]` variables.
fn review_with_env(env: &[usize]) -> anyhow::Result<Vec<u8>> {
    let mut review: Value = serde_json::from_str(REVIEW)?;
    let containers = review["request"]["object"]["spec"]["containers"]
        .as_array_mut()
        .context("fixture has containers")?;
    ensure!(
        containers.len() >= env.len(),
        "fixture has too few containers"
    );
    for (i, count) in env.iter().enumerate() {
        containers[i]["env"] = env_vars(i, *count);
    }
    Ok(serde_json::to_vec(&review)?)
}

/// The typical review for `count` different ReplicaSets (their `pod-template-hash` differs), so
/// that no two bodies share a pod context: each review renders its templates afresh, as the first
/// pod of a new rollout does, whatever the engine caches per context.
fn distinct_reviews(count: usize) -> anyhow::Result<Vec<Vec<u8>>> {
    let typical: Value = serde_json::from_str(REVIEW)?;
    (0..count)
        .map(|i| {
            let mut review = typical.clone();
            let hash = format!("{i:010x}");
            let meta = &mut review["request"]["object"]["metadata"];
            meta["labels"]["pod-template-hash"] = json!(hash);
            meta["generateName"] = json!(format!("checkout-{hash}-"));
            Ok(serde_json::to_vec(&review)?)
        })
        .collect()
}

/// More distinct pods than any cache of renderings here holds (4,096 entries).
const DISTINCT: usize = 5_000;

/// A named AdmissionReview body.
type Case = (&'static str, Vec<u8>);

fn prepare() -> anyhow::Result<(Injector, Vec<Case>)> {
    let injector = Injector::embedded(None)?;
    let typical: Value = serde_json::from_str(REVIEW)?;
    let cases = vec![
        ("typical", serde_json::to_vec(&typical)?),
        ("env_10", review_with_env(&[10])?),
        ("env_100", review_with_env(&[100])?),
        ("env_1000", review_with_env(&[1_000])?),
        ("env_10000", review_with_env(&[10_000])?),
        ("2x2000_env", review_with_env(&[2_000, 2_000])?),
    ];
    // Measure the path that matters: every body must come back with a patch.
    for (name, body) in &cases {
        let answer = review::answer(&injector, Webhook::Mutate, body)?;
        ensure!(
            answer.outcome == Outcome::Injected,
            "{name}: expected an injection, got {:?}",
            answer.outcome
        );
    }
    Ok((injector, cases))
}

/// What a bench needs, or the reason it cannot run, and exit: criterion has no error path.
fn prepared_or_exit<T>(prepared: anyhow::Result<T>) -> T {
    prepared.unwrap_or_else(|error| {
        eprintln!("cannot prepare the engine benches: {error:#}");
        std::process::exit(1);
    })
}

fn engine_distinct(c: &mut Criterion) {
    let prepared = Injector::embedded(None)
        .map_err(anyhow::Error::from)
        .and_then(|injector| Ok((injector, distinct_reviews(DISTINCT)?)));
    let (injector, bodies) = prepared_or_exit(prepared);
    let mut next = 0;
    c.benchmark_group("mutate")
        .bench_function("typical_distinct", |b| {
            b.iter(|| {
                next = (next + 1) % bodies.len();
                review::answer(
                    &injector,
                    Webhook::Mutate,
                    std::hint::black_box(&bodies[next]),
                )
            })
        });
}

/// The typical review with `count` different uids: the same pod, as a rollout's replicas are.
fn replicas(count: usize) -> anyhow::Result<Vec<Vec<u8>>> {
    let typical: Value = serde_json::from_str(REVIEW)?;
    (0..count)
        .map(|i| {
            let mut review = typical.clone();
            review["request"]["uid"] = json!(format!("0f6b4a4e-6f1c-4a63-9a1e-{i:012x}"));
            // A token volume name of its own, as the API server gives each replica.
            let text = serde_json::to_string(&review)?
                .replace("kube-api-access-x7k2p", &format!("kube-api-access-{i:05x}"));
            Ok(text.into_bytes())
        })
        .collect()
}

fn engine_memo(c: &mut Criterion) {
    let prepared = Injector::embedded(None)
        .map_err(anyhow::Error::from)
        .and_then(|injector| Ok((std::sync::Arc::new(injector), replicas(1_000)?)));
    let (injector, bodies) = prepared_or_exit(prepared);
    let memo = Memo::new(sidecar_injector::memo::DEFAULT_ENTRIES);
    // Kept the second time it comes.
    let _ = memo.answer(&injector, Webhook::Mutate, Entry::Pod, &bodies[0]);
    let (_, recall) = memo.answer(&injector, Webhook::Mutate, Entry::Pod, &bodies[1]);
    if recall != Recall::Miss {
        eprintln!("the memory of answers did not take the typical review: {recall:?}");
        std::process::exit(1);
    }
    let mut next = 0;
    c.benchmark_group("mutate")
        .bench_function("typical_memo", |b| {
            b.iter(|| {
                next = (next + 1) % bodies.len();
                let (answer, recall) = memo.answer(
                    &injector,
                    Webhook::Mutate,
                    Entry::Pod,
                    std::hint::black_box(&bodies[next]),
                );
                assert_eq!(recall, Recall::Hit);
                answer
            })
        });
}

fn engine(c: &mut Criterion) {
    let (injector, cases) = prepared_or_exit(prepare());
    let mut group = c.benchmark_group("mutate");
    for (name, body) in &cases {
        group.bench_function(*name, |b| {
            b.iter(|| review::answer(&injector, Webhook::Mutate, std::hint::black_box(body)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Short, so that `make bench` stays within its ten minutes.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .without_plots();
    targets = engine, engine_distinct, engine_memo
}
criterion_main!(benches);
