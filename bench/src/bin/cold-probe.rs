//! The engine's time per typical review when it does not run back to back: `review::answer`
//! (mutate) on the bench's review, timed alone, after each of these between two reviews:
//!
//! - `hot`: nothing (what criterion and the instruction counts see);
//! - `sleepN`: the thread sleeps N µs, as a webhook worker parks between requests;
//! - `spinN`: the thread stays busy N µs instead (same gap, no sleep);
//! - `thrashN`: N MiB of other memory is written (caches evicted, no sleep);
//! - `pagesN`: one byte written in each of N other 4-KiB pages (N lines, N pages: the TLB's
//!   entries evicted for few cache lines);
//! - `linesN`: N other 64-byte lines written in a row (N lines, N / 64 pages): the same lines
//!   as `pagesN` without its pages, so the two together tell what the pages cost.
//! - `branchesN`: N branches taken or not at random (a xorshift's bits) from 64 places in the
//!   code: the branch predictor's history and tables filled with other branches, as the
//!   transport's code fills them between two reviews in the server, for few cache lines.
//! - `yieldN`: N `sched_yield` calls: into the kernel and back, the CPU never idle;
//! - `sleepN+spinM`: a sleep of N µs, then M µs busy: whether what a sleep loses comes back
//!   by itself with time;
//! - `sleepN+review`: a sleep of N µs, then one review untimed: whether the review brings back
//!   what the sleep lost; `sleepN+view`: the same with only the review's view read (its
//!   code and data; the answer's left cold): how what the sleep lost divides between the two;
//!   `sleepN+twin`: the same with one review untimed by a second injector on a copy of the
//!   body (the same code and allocator, none of the same templates, fragments or caches);
//!   `sleepN+bufs`: the same with only two buffers of the sizes of the patch's and the
//!   answer's allocated, written and freed (the blocks the review's patch and answer are then
//!   given);
//! - `pingpong`: two threads review in turns on one injector, each spinning while the other
//!   reviews (no core sleeps), so every review follows one on the other core: what the cache
//!   lines both threads write cost as they move between cores; `pingpong-own`: the same with
//!   an injector each.
//!
//! `cold-probe [--modes hot,sleep50,spin50,thrash32] [--reviews 2000]` prints the mean and the
//! median of each. Times on a shared machine move; compare modes within one run.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use sidecar_injector::config::Injector;
use sidecar_injector::review::{self, Webhook};

#[derive(Debug, Parser)]
struct Args {
    /// What happens between two reviews (comma-separated).
    #[arg(
        long,
        default_value = "hot,sleep20,sleep100,sleep500,spin100,spin500,thrash4,thrash32"
    )]
    modes: String,
    /// Reviews timed per mode.
    #[arg(long, default_value_t = 2000)]
    reviews: usize,
}

enum Gap {
    Hot,
    Sleep(Duration),
    Spin(Duration),
    /// Bytes between two writes, and how many writes (`thrashN` is N MiB at 64).
    Stride(usize, usize),
    /// How many random branches.
    Branches(usize),
    /// Two threads review in turns (each spins while the other reviews), on one injector
    /// (`pingpong`) or each on its own (`pingpong-own`).
    PingPong {
        own: bool,
    },
    /// How many `sched_yield` calls.
    Yield(usize),
    /// A sleep, then a spin.
    SleepSpin(Duration, Duration),
    /// A sleep, then one review untimed.
    SleepReview(Duration),
    /// A sleep, then one view read, untimed.
    SleepView(Duration),
    /// A sleep, then one review untimed by a second injector on a copy of the body.
    SleepTwin(Duration),
    /// A sleep, then two buffers of the patch's and the answer's sizes allocated, written and
    /// freed.
    SleepBufs(Duration),
}

fn gap(mode: &str) -> anyhow::Result<Gap> {
    let number = |prefix: &str| -> anyhow::Result<u64> {
        mode[prefix.len()..]
            .parse()
            .with_context(|| format!("mode {mode:?}: a number must follow {prefix:?}"))
    };
    Ok(match mode {
        "hot" => Gap::Hot,
        m if m.starts_with("sleep") && m.contains('+') => {
            let (sleep, then) = m["sleep".len()..].split_once('+').context("sleepN+…")?;
            let micros = |n: &str| -> anyhow::Result<Duration> {
                Ok(Duration::from_micros(n.parse().with_context(|| {
                    format!("mode {mode:?}: {n:?} is not a number of µs")
                })?))
            };
            let sleep = micros(sleep)?;
            match then {
                "review" => Gap::SleepReview(sleep),
                "view" => Gap::SleepView(sleep),
                "twin" => Gap::SleepTwin(sleep),
                "bufs" => Gap::SleepBufs(sleep),
                t if t.starts_with("spin") => Gap::SleepSpin(sleep, micros(&t["spin".len()..])?),
                _ => bail!("mode {mode:?}: after sleepN+ comes review, view, twin, bufs or spinM"),
            }
        }
        m if m.starts_with("sleep") => Gap::Sleep(Duration::from_micros(number("sleep")?)),
        m if m.starts_with("yield") => Gap::Yield(usize::try_from(number("yield")?)?),
        m if m.starts_with("spin") => Gap::Spin(Duration::from_micros(number("spin")?)),
        m if m.starts_with("thrash") => Gap::Stride(64, usize::try_from(number("thrash")?)? << 14),
        m if m.starts_with("pages") => Gap::Stride(4096, usize::try_from(number("pages")?)?),
        m if m.starts_with("lines") => Gap::Stride(64, usize::try_from(number("lines")?)?),
        "pingpong" => Gap::PingPong { own: false },
        "pingpong-own" => Gap::PingPong { own: true },
        m if m.starts_with("branches") => Gap::Branches(usize::try_from(number("branches")?)?),
        m => bail!(
            "unknown mode {m:?} (hot, sleepN, spinN, thrashN, pagesN, linesN, branchesN, \
             yieldN, sleepN+spinM, sleepN+review, sleepN+view, sleepN+twin, sleepN+bufs, pingpong, pingpong-own)"
        ),
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let body = sidecar_injector_bench::review_body()?;
    let text = std::str::from_utf8(&body).context("the bench's review is not UTF-8")?;
    let injector = Injector::embedded(None)?;
    let gaps = args
        .modes
        .split(',')
        .map(|m| Ok((m, gap(m)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let largest = gaps
        .iter()
        .map(|(_, g)| match g {
            Gap::Stride(stride, n) => stride * n,
            _ => 0,
        })
        .max()
        .unwrap_or(0);
    let mut other = vec![0u8; largest];
    // The answer's length, for `sleepN+bufs` (its buffer is allocated at about that size).
    let answer_len = one_review(&injector, &body)?.body.len();
    let twin = gaps
        .iter()
        .any(|(_, g)| matches!(g, Gap::SleepTwin(_)))
        .then(|| anyhow::Ok((Injector::embedded(None)?, body.clone())))
        .transpose()?;
    for (mode, gap) in &gaps {
        if let Gap::PingPong { own } = gap {
            let second = Injector::embedded(None)?;
            let injectors = [&injector, if *own { &second } else { &injector }];
            let times = ping_pong(injectors, &body, args.reviews)?;
            report(mode, times)?;
            continue;
        }
        let mut times = Vec::with_capacity(args.reviews);
        for i in 0..args.reviews {
            match gap {
                Gap::Hot => {}
                Gap::Sleep(d) => std::thread::sleep(*d),
                Gap::Spin(d) => spin_for(*d),
                Gap::Stride(stride, n) => {
                    for byte in other[..stride * n].iter_mut().step_by(*stride) {
                        *byte = byte.wrapping_add(i as u8);
                    }
                    std::hint::black_box(&other);
                }
                Gap::Branches(n) => {
                    std::hint::black_box(random_branches(*n, i as u64));
                }
                Gap::PingPong { .. } => {}
                Gap::Yield(n) => {
                    for _ in 0..*n {
                        std::thread::yield_now();
                    }
                }
                Gap::SleepSpin(sleep, spin) => {
                    std::thread::sleep(*sleep);
                    spin_for(*spin);
                }
                Gap::SleepView(sleep) => {
                    std::thread::sleep(*sleep);
                    let view =
                        sidecar_injector::view::ReviewView::parse(std::hint::black_box(text))?;
                    std::hint::black_box(&view);
                }
                Gap::SleepTwin(sleep) => {
                    std::thread::sleep(*sleep);
                    if let Some((injector, body)) = &twin {
                        std::hint::black_box(one_review(injector, std::hint::black_box(body))?);
                    }
                }
                Gap::SleepBufs(sleep) => {
                    std::thread::sleep(*sleep);
                    // The patch's JSON starts with room for 2,048 bytes (inject::write_patch).
                    let patch = vec![1u8; 2048];
                    let answer = vec![1u8; answer_len];
                    std::hint::black_box((&patch, &answer));
                }
                Gap::SleepReview(sleep) => {
                    std::thread::sleep(*sleep);
                    std::hint::black_box(one_review(&injector, std::hint::black_box(&body))?);
                }
            }
            let start = Instant::now();
            let answer = one_review(&injector, std::hint::black_box(&body))?;
            times.push(start.elapsed());
            std::hint::black_box(answer);
        }
        report(mode, times)?;
    }
    Ok(())
}

fn spin_for(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn report(mode: &str, mut times: Vec<Duration>) -> anyhow::Result<()> {
    times.sort_unstable();
    let mean = times.iter().sum::<Duration>() / u32::try_from(times.len())?;
    let median = times[times.len() / 2];
    println!(
        "{mode:10} mean {:6.1} µs  median {:6.1} µs",
        mean.as_secs_f64() * 1e6,
        median.as_secs_f64() * 1e6
    );
    Ok(())
}

/// `reviews` reviews on each of two threads, in turns: each thread spins until its turn, so
/// neither core sleeps, and every review follows one on the other core.
fn ping_pong(
    injectors: [&Injector; 2],
    body: &[u8],
    reviews: usize,
) -> anyhow::Result<Vec<Duration>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let turn = AtomicUsize::new(0);
    let turn = &turn;
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let injector = injectors[t];
                s.spawn(move || -> anyhow::Result<Vec<Duration>> {
                    let mut times = Vec::with_capacity(reviews);
                    for i in 0..reviews {
                        let mine = 2 * i + t;
                        while turn.load(Ordering::Acquire) != mine {
                            std::hint::spin_loop();
                        }
                        let start = Instant::now();
                        let answer = one_review(injector, std::hint::black_box(body))?;
                        times.push(start.elapsed());
                        std::hint::black_box(answer);
                        turn.store(mine + 1, Ordering::Release);
                    }
                    Ok(times)
                })
            })
            .collect();
        let mut all = Vec::new();
        for thread in threads {
            all.extend(
                thread
                    .join()
                    .map_err(|_| anyhow::anyhow!("a thread panicked"))??,
            );
        }
        Ok(all)
    })
}

/// One review, never inlined: `bench/profile.sh` counts the cache misses inside this function
/// only (callgrind's --toggle-collect), whatever a build inlines into it.
#[inline(never)]
fn one_review(injector: &Injector, body: &[u8]) -> anyhow::Result<review::Answer> {
    Ok(review::answer(injector, Webhook::Mutate, body)?)
}

/// `n` branches whose outcomes are a xorshift's bits, spread over 64 places in the code (a
/// macro writes each out), so that the predictor's tables hold them instead of a review's.
#[inline(never)]
fn random_branches(n: usize, seed: u64) -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut sum = 0u64;
    macro_rules! place {
        ($($k:literal)*) => {$(
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x & 1 == 0 {
                sum = sum.wrapping_add($k);
            } else {
                sum ^= x >> $k;
            }
        )*};
    }
    for _ in 0..n.div_ceil(64) {
        place!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
               33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63);
        sum = std::hint::black_box(sum);
    }
    sum
}
