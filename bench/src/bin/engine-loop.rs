//! A fixed amount of engine work for a profiler: `review::answer` (mutate) on the bench's review
//! `--iterations` times, optionally with the first container's env replaced by `--env N`
//! variables. `valgrind --tool=callgrind target/release/engine-loop --iterations 200` gives
//! instruction counts that repeat from run to run, unlike times on a shared machine. With
//! `--memo`, through the server's memory of answers (`memo::Memo`), the reviews taking 256 uids
//! and token volume names in turn: after the first two, what a replica like one just answered
//! costs. With `--stage view` or `--stage step`, only a part of a review: reading its view
//! (`view::ReviewView::parse`), or the JSON reader stepping over the whole body, checking it
//! and building nothing (`json::Reader::skip`): the floor of any review that reads its body
//! strictly with this reader.

use anyhow::{Context as _, ensure};
use clap::Parser;
use serde_json::{Value, json};
use sidecar_injector::config::Injector;
use sidecar_injector::engine::json::Reader;
use sidecar_injector::engine::view::ReviewView;
use sidecar_injector::inject::Entry;
use sidecar_injector::memo::{Memo, Recall};
use sidecar_injector::review::{self, Outcome, Webhook};

/// The token volume's name in bench/review.json.
const TOKEN_NAME: &str = "kube-api-access-x7k2p";

/// Replicas (uids) made for `--memo`.
const MEMO_BODIES: u64 = 256;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 100)]
    iterations: u32,
    /// Replace the env of the first `--containers` containers by this many variables each.
    #[arg(long)]
    env: Option<usize>,
    #[arg(long, default_value_t = 1)]
    containers: usize,
    /// Cycle through this many pods of different ReplicaSets (`pod-template-hash`), so that
    /// reviews do not share a pod context.
    #[arg(long, default_value_t = 1)]
    distinct: usize,
    /// With `--distinct`: vary the namespace instead of the ReplicaSet, so that every template
    /// renders anew (the bundled templates read the namespace).
    #[arg(long)]
    new_namespace: bool,
    /// Answer through the memory of answers, the reviews taking 256 uids in turn (made before
    /// the loop); every review after the second must come from memory.
    #[arg(long, conflicts_with = "distinct")]
    memo: bool,
    /// How much of a review to do: all of it (`answer`), only reading its view (`view`), or
    /// only stepping over its JSON, checked (`step`).
    #[arg(long, value_enum, default_value_t = Stage::Answer, conflicts_with = "memo")]
    stage: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Stage {
    Answer,
    View,
    Step,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut review: Value = serde_json::from_str(sidecar_injector_bench::REVIEW)?;
    if let Some(count) = args.env {
        let containers = review["request"]["object"]["spec"]["containers"]
            .as_array_mut()
            .context("fixture has containers")?;
        ensure!(args.containers <= containers.len(), "too many containers");
        for (c, container) in containers.iter_mut().take(args.containers).enumerate() {
            container["env"] = (0..count)
                .map(|i| json!({"name": format!("C{c}_VAR_{i:05}"), "value": format!("value-{i}")}))
                .collect();
        }
    }
    let bodies = (0..args.distinct.max(1))
        .map(|i| {
            let mut review = review.clone();
            if args.distinct > 1 && args.new_namespace {
                let namespace = json!(format!("shop-{i:04}"));
                review["request"]["namespace"] = namespace.clone();
                review["request"]["object"]["metadata"]["namespace"] = namespace;
            } else if args.distinct > 1 {
                let hash = format!("{i:010x}");
                let meta = &mut review["request"]["object"]["metadata"];
                meta["labels"]["pod-template-hash"] = json!(hash);
                meta["generateName"] = json!(format!("checkout-{hash}-"));
            }
            serde_json::to_vec(&review)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let injector = Injector::embedded(None)?;
    let mut bytes = 0;
    if args.memo {
        let uid = sidecar_injector_bench::request_uid(&bodies[0])?;
        let quoted = serde_json::to_string(&uid)?;
        let text = String::from_utf8(bodies[0].clone())?;
        // As many bodies whatever the iterations, so that making them costs a profiler's run
        // of 1 what it costs one of 41 (the reviews then take them in turn).
        let bodies: Vec<Vec<u8>> = (0..MEMO_BODIES)
            .map(|n| {
                let fresh = sidecar_injector_bench::numbered_uid(&uid, n);
                // And a token volume name of its own, as the API server gives each replica.
                text.replacen(&quoted, &format!("\"{fresh}\""), 1)
                    .replace(TOKEN_NAME, &format!("kube-api-access-{n:05x}"))
                    .into_bytes()
            })
            .collect();
        let injector = std::sync::Arc::new(injector);
        let memo = Memo::new(sidecar_injector::memo::DEFAULT_ENTRIES);
        for i in 0..args.iterations as usize {
            let body = &bodies[i % bodies.len()];
            let (answer, recall) = memo.answer(
                &injector,
                Webhook::Mutate,
                Entry::Pod,
                std::hint::black_box(body),
            );
            let answer = answer?;
            ensure!(answer.outcome == Outcome::Injected, "not injected");
            ensure!(i < 2 || recall == Recall::Hit, "review {i} not from memory");
            bytes += answer.body.len();
        }
        println!(
            "{} reviews of {} bytes, all but the first two from memory, {bytes} bytes answered",
            args.iterations,
            bodies[0].len()
        );
        return Ok(());
    }
    if args.stage != Stage::Answer {
        // The body as text, checked once here: the review's own UTF-8 check is the answer's.
        let texts = bodies
            .iter()
            .map(|b| std::str::from_utf8(b))
            .collect::<Result<Vec<_>, _>>()?;
        for i in 0..args.iterations as usize {
            let text = std::hint::black_box(texts[i % texts.len()]);
            if args.stage == Stage::View {
                let view = ReviewView::parse(text)?;
                ensure!(view.request.is_some(), "the view has no request");
            } else {
                let mut reader = Reader::new(text);
                reader.skip()?;
                reader.end()?;
            }
        }
        println!(
            "{:?}: {} bodies of {} bytes",
            args.stage,
            args.iterations,
            bodies[0].len()
        );
        return Ok(());
    }
    for i in 0..args.iterations as usize {
        let body = &bodies[i % bodies.len()];
        let answer = review::answer(&injector, Webhook::Mutate, std::hint::black_box(body))?;
        ensure!(answer.outcome == Outcome::Injected, "not injected");
        bytes += answer.body.len();
    }
    println!(
        "{} reviews of {} bytes, {bytes} bytes answered",
        args.iterations,
        bodies[0].len()
    );
    Ok(())
}
