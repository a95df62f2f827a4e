//! The one decision of a self-managed certificate: given what the TLS Secret holds, what the
//! two webhook configurations trust and the time, the next step to take. Pure; the server's
//! shell reads the Secret and the configurations, takes the step (writing with the Secret's
//! resourceVersion, so that of two replicas deciding at once one writes and the other reads
//! again), and asks again.
//!
//! The order of the steps is what keeps every replica trusted at every moment:
//! - a webhook whose `caBundle` is not the Secret's bundle is mended before anything else;
//! - a CA near its end gets a successor *added* to the bundle, and signs on;
//! - only once every webhook trusts the successor is the serving certificate re-issued by it;
//! - the old CA leaves the bundle only after [`Policy::reload_grace`] has passed since then,
//!   by which time every replica serves the new certificate (a mounted Secret reaches a pod's
//!   files within the kubelet's sync period; the server reloads them when they change).

/// How long before its issue a certificate's validity starts, so that an API server whose
/// clock is a little behind accepts it at once. What the plan counts from is the issue.
pub const BACKDATE: i64 = 60;

fn issued(not_before: i64) -> i64 {
    not_before + BACKDATE
}

/// A CA of the bundle, as read from its certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ca {
    /// The SHA-256 of its DER: what a webhook's `caBundle` is compared by.
    pub id: [u8; 32],
    /// Seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
}

/// The serving certificate, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Serving {
    /// The bundle's CA that signed it (by [`Ca::id`]); `None` when none of them did.
    pub issuer: Option<[u8; 32]>,
    pub not_before: i64,
    pub not_after: i64,
    /// Whether it is valid for every name the API server dials (the Service's DNS names).
    pub names_ok: bool,
    /// Whether `tls.key` is its key.
    pub key_ok: bool,
}

/// What the Secret holds, read and checked by the shell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// `ca.crt`: the CAs a webhook must trust, oldest first (one, or two during a roll-over).
    pub bundle: Vec<Ca>,
    /// The CA whose key the Secret keeps (`ca.key`), which signs serving certificates.
    pub signer: Option<[u8; 32]>,
    pub serving: Option<Serving>,
}

/// Lifetimes and margins, in seconds (the chart's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub ca_lifetime: i64,
    pub serving_lifetime: i64,
    /// A certificate is renewed when less than `1 / renew_divisor` of its life is left (3:
    /// with a third left, as cert-manager does by default).
    pub renew_divisor: i64,
    /// How long after a serving certificate is switched to a new CA the old CA stays trusted.
    pub reload_grace: i64,
    /// How often the state is looked at again when nothing is due (a `helm upgrade` that
    /// resets a `caBundle` is mended within this).
    pub recheck: i64,
}

impl Default for Policy {
    fn default() -> Self {
        const DAY: i64 = 86_400;
        Policy {
            ca_lifetime: 365 * DAY,
            serving_lifetime: 60 * DAY,
            renew_divisor: 3,
            reload_grace: 5 * 60,
            recheck: 30,
        }
    }
}

/// What was observed, at `now`.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// The Secret read and checked; `Err` with why when it is missing or unusable.
    pub stored: Result<&'a Stored, &'a str>,
    /// For each webhook configuration we own, the CAs its `caBundle` holds (by [`Ca::id`]).
    pub trusted: &'a [Vec<[u8; 32]>],
    pub now: i64,
}

/// The next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing usable is stored: a new CA and a serving certificate signed by it.
    Issue { why: String },
    /// Set each webhook's `caBundle` to the Secret's bundle.
    MendBundles,
    /// The signer nears its end: a new CA is added to the bundle and becomes the signer; the
    /// serving certificate stays as it is.
    AddCa,
    /// Every webhook trusts the signer, but the serving certificate is not (yet) its own, or
    /// nears its end, or does not fit: a new one, signed by the signer.
    RenewServing { why: &'static str },
    /// The old CA has signed nothing served for [`Policy::reload_grace`]: it leaves the bundle.
    DropCa { id: [u8; 32] },
    /// Nothing is due before `until` (seconds since the epoch).
    Wait { until: i64 },
}

/// Whether less than `1 / divisor` of the life of `[not_before, not_after)` is left at `now`.
fn due(not_before: i64, not_after: i64, divisor: i64, now: i64) -> bool {
    now >= renew_at(not_before, not_after, divisor)
}

/// When a certificate has `1 / divisor` of its life left, its life counted from its issue.
pub fn renew_at(not_before: i64, not_after: i64, divisor: i64) -> i64 {
    not_after - (not_after - issued(not_before).min(not_after)).max(0) / divisor.max(1)
}

/// The next step for what was observed.
pub fn next(policy: &Policy, seen: &Observed<'_>) -> Step {
    let now = seen.now;
    let stored = match seen.stored {
        Ok(stored) => stored,
        Err(why) => {
            return Step::Issue {
                why: why.to_owned(),
            };
        }
    };
    let usable = |ca: &&Ca| ca.not_before <= now && now < ca.not_after;
    let Some(signer) = stored
        .signer
        .and_then(|id| stored.bundle.iter().find(|ca| ca.id == id))
        .filter(usable)
    else {
        return Step::Issue {
            why: "the Secret keeps no usable CA key (none, or its CA is not in ca.crt or expired)"
                .to_owned(),
        };
    };
    let bundle: Vec<[u8; 32]> = stored.bundle.iter().map(|ca| ca.id).collect();
    if seen.trusted.iter().any(|t| t != &bundle) {
        return Step::MendBundles;
    }
    let serving = stored.serving.as_ref();
    // Served by the signer already: the roll-over's last step, once the grace has passed.
    let drop = serving
        .filter(|s| s.issuer == Some(signer.id))
        .zip(stored.bundle.iter().find(|ca| ca.id != signer.id))
        .map(|(s, old)| {
            (
                old.id,
                (issued(s.not_before) + policy.reload_grace).min(old.not_after),
            )
        });
    if let Some((id, at)) = drop
        && now >= at
    {
        return Step::DropCa { id };
    }
    let switch_at = issued(signer.not_before) + policy.recheck;
    let why = match serving {
        None => Some("the Secret holds no serving certificate"),
        Some(s) if !s.key_ok => Some("tls.key is not the serving certificate's key"),
        Some(s) if !s.names_ok => Some("the serving certificate is not valid for the Service"),
        Some(s) if s.issuer != Some(signer.id) => match s.issuer {
            // The signer is trusted by every webhook (checked above), as stored; the API
            // server's own copy of the configurations follows a moment later, so the switch
            // waits a re-check after the signer's issue.
            Some(_) if now < switch_at => None,
            Some(_) => Some("the serving certificate is switched to the new CA"),
            None => Some("no CA of the bundle signed the serving certificate"),
        },
        Some(s) if now < s.not_before || now >= s.not_after => {
            Some("the serving certificate is not valid now")
        }
        Some(s) if due(s.not_before, s.not_after, policy.renew_divisor, now) => {
            Some("the serving certificate nears its end")
        }
        Some(_) => None,
    };
    // A serving certificate from a signer that leaves before it does would end with it.
    let alone = stored.bundle.len() == 1;
    if alone
        && due(
            signer.not_before,
            signer.not_after,
            policy.renew_divisor,
            now,
        )
    {
        return Step::AddCa;
    }
    if let Some(why) = why {
        return Step::RenewServing { why };
    }
    let mut until = now + policy.recheck;
    if let Some(s) = serving {
        until = until.min(renew_at(s.not_before, s.not_after, policy.renew_divisor));
    }
    if let Some((_, at)) = drop {
        until = until.min(at);
    }
    if serving.is_some_and(|s| s.issuer.is_some_and(|i| i != signer.id)) {
        until = until.min(switch_at);
    }
    if alone {
        until = until.min(renew_at(
            signer.not_before,
            signer.not_after,
            policy.renew_divisor,
        ));
    }
    Step::Wait {
        until: until.max(now + 1),
    }
}

/// When a serving certificate issued at `now` by `signer` ends: its lifetime, but never after
/// its signer.
pub fn serving_not_after(policy: &Policy, signer: &Ca, now: i64) -> i64 {
    (now + policy.serving_lifetime).min(signer.not_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        ca_lifetime: 3_600,
        serving_lifetime: 600,
        renew_divisor: 3,
        reload_grace: 120,
        recheck: 10,
    };

    /// A cluster as the steps change it: the Secret, each webhook's bundle (mended `lag`
    /// seconds after it is asked to be), and what each of two replicas serves (the Secret's
    /// serving certificate, reloaded `reload[i]` seconds after it changed).
    struct World {
        policy: Policy,
        next_id: u8,
        stored: Stored,
        trusted: Vec<Vec<[u8; 32]>>,
        mend_at: Option<i64>,
        lag: i64,
        /// The serving certificate each replica serves, and the history of the Secret's.
        served: Vec<Option<Serving>>,
        history: Vec<(i64, Serving)>,
        reload: [i64; 2],
        /// Every CA made.
        cas: Vec<Ca>,
    }

    impl World {
        fn new(policy: Policy, lag: i64, reload: [i64; 2]) -> Self {
            World {
                policy,
                next_id: 0,
                stored: Stored {
                    bundle: Vec::new(),
                    signer: None,
                    serving: None,
                },
                trusted: vec![Vec::new(), Vec::new()],
                mend_at: None,
                lag,
                served: vec![None, None],
                history: Vec::new(),
                reload,
                cas: Vec::new(),
            }
        }

        fn ca(&mut self, now: i64) -> Ca {
            self.next_id += 1;
            let ca = Ca {
                id: [self.next_id; 32],
                not_before: now - BACKDATE,
                not_after: now + self.policy.ca_lifetime,
            };
            self.cas.push(ca.clone());
            ca
        }

        fn serve(&mut self, now: i64, signer: &Ca) {
            let s = Serving {
                issuer: Some(signer.id),
                not_before: now - BACKDATE,
                not_after: serving_not_after(&self.policy, signer, now),
                names_ok: true,
                key_ok: true,
            };
            self.stored.serving = Some(s.clone());
            self.history.push((now, s));
        }

        fn take(&mut self, step: &Step, now: i64) {
            match step {
                Step::Issue { .. } => {
                    let ca = self.ca(now);
                    self.stored.bundle = vec![ca.clone()];
                    self.stored.signer = Some(ca.id);
                    self.serve(now, &ca);
                }
                Step::MendBundles => {
                    self.mend_at.get_or_insert(now + self.lag);
                }
                Step::AddCa => {
                    let ca = self.ca(now);
                    self.stored.signer = Some(ca.id);
                    self.stored.bundle.push(ca);
                }
                Step::RenewServing { .. } => {
                    let id = self.stored.signer.expect("a signer");
                    let signer = self.stored.bundle.iter().find(|c| c.id == id).cloned();
                    self.serve(now, &signer.expect("in the bundle"));
                }
                Step::DropCa { id } => self.stored.bundle.retain(|c| c.id != *id),
                Step::Wait { .. } => {}
            }
        }

        /// Time passes: webhooks are mended, replicas reload.
        fn tick(&mut self, now: i64) {
            if self.mend_at.is_some_and(|at| now >= at) {
                let bundle: Vec<_> = self.stored.bundle.iter().map(|c| c.id).collect();
                self.trusted = vec![bundle.clone(), bundle];
                self.mend_at = None;
            }
            for (i, delay) in self.reload.into_iter().enumerate() {
                self.served[i] = self
                    .history
                    .iter()
                    .rev()
                    .find(|(at, _)| now >= at + delay)
                    .map(|(_, s)| s.clone());
            }
        }

        /// Every replica's certificate is verified by every webhook: valid now, and signed by
        /// a CA its bundle trusts that is valid now.
        fn refused(&self, now: i64) -> Option<String> {
            for (i, s) in self.served.iter().enumerate() {
                let Some(s) = s else { continue };
                if now < s.not_before || now >= s.not_after {
                    return Some(format!("replica {i} serves an expired certificate"));
                }
                let issuer = s.issuer.expect("issued");
                let ca_valid = self
                    .cas
                    .iter()
                    .any(|c| c.id == issuer && c.not_before <= now && now < c.not_after);
                for (w, t) in self.trusted.iter().enumerate() {
                    if !t.contains(&issuer) || !ca_valid {
                        return Some(format!("webhook {w} refuses replica {i} at {now}"));
                    }
                }
            }
            None
        }
    }

    /// Runs the world from nothing for `seconds`, a step a second; returns the steps taken
    /// (not the waits) and the first refusal, if any, once the first bundle was mended.
    fn run(lag: i64, reload: [i64; 2], seconds: i64) -> (Vec<Step>, Option<String>) {
        run_with(POLICY, lag, reload, seconds)
    }

    fn run_with(
        policy: Policy,
        lag: i64,
        reload: [i64; 2],
        seconds: i64,
    ) -> (Vec<Step>, Option<String>) {
        let mut world = World::new(policy, lag, reload);
        let mut steps = Vec::new();
        let mut started = false;
        for now in 1_000..1_000 + seconds {
            world.tick(now);
            // Up to a few steps a second, as the shell takes one after another.
            for _ in 0..4 {
                let stored = world.stored.clone();
                let observed = Observed {
                    stored: if stored.bundle.is_empty() {
                        Err("no Secret")
                    } else {
                        Ok(&stored)
                    },
                    trusted: &world.trusted,
                    now,
                };
                let step = next(&policy, &observed);
                if let Step::Wait { until } = step {
                    assert!(until > now, "{until} {now}");
                    break;
                }
                world.take(&step, now);
                steps.push(step);
            }
            started |= world.trusted.iter().all(|t| !t.is_empty())
                && world.served.iter().all(Option::is_some);
            if started && let Some(why) = world.refused(now) {
                return (steps, Some(why));
            }
        }
        (steps, None)
    }

    fn kinds(steps: &[Step]) -> Vec<&'static str> {
        steps
            .iter()
            .map(|s| match s {
                Step::Issue { .. } => "issue",
                Step::MendBundles => "mend",
                Step::AddCa => "add-ca",
                Step::RenewServing { .. } => "renew",
                Step::DropCa { .. } => "drop-ca",
                Step::Wait { .. } => "wait",
            })
            .collect()
    }

    #[test]
    fn renewals_and_roll_overs_leave_no_moment_a_replica_is_refused() {
        // Three CA lifetimes: two roll-overs and many serving renewals, with webhooks mended
        // up to 20 s late and replicas reloading up to the grace's length late.
        for (lag, reload) in [(0, [0, 0]), (5, [30, 90]), (20, [119, 1])] {
            let (steps, refused) = run(lag, reload, 3 * POLICY.ca_lifetime);
            assert_eq!(
                refused,
                None,
                "lag {lag}, reload {reload:?}: {:?}",
                kinds(&steps)
            );
            let k = kinds(&steps);
            assert_eq!(k[0], "issue");
            assert_eq!(k.iter().filter(|s| **s == "issue").count(), 1, "{k:?}");
            assert!(k.iter().filter(|s| **s == "add-ca").count() >= 2, "{k:?}");
            assert!(k.iter().filter(|s| **s == "drop-ca").count() >= 2, "{k:?}");
            assert!(k.iter().filter(|s| **s == "renew").count() >= 10, "{k:?}");
        }
    }

    #[test]
    fn lifetimes_of_seconds_renew_at_their_pace_not_at_once() {
        // The e2e's lifetimes (s29): certificates start BACKDATE before their issue, which
        // must not count as life already spent.
        let policy = Policy {
            ca_lifetime: 27,
            serving_lifetime: 12,
            renew_divisor: 3,
            reload_grace: 3,
            recheck: 1,
        };
        let (steps, refused) = run_with(policy, 0, [1, 1], 270);
        assert_eq!(refused, None, "{:?}", kinds(&steps));
        let k = kinds(&steps);
        let renewals = k.iter().filter(|s| **s == "renew").count();
        let roll_overs = k.iter().filter(|s| **s == "add-ca").count();
        // About one renewal each 8 s (a third of 12 left) and a roll-over each 18 s.
        assert!((25..=45).contains(&renewals), "{renewals} renewals: {k:?}");
        assert!(
            (10..=16).contains(&roll_overs),
            "{roll_overs} roll-overs: {k:?}"
        );
    }

    #[test]
    fn the_grace_is_what_keeps_a_slow_replica_trusted() {
        // A replica that reloads later than the grace is refused: the test can fail.
        let (_, refused) = run(0, [0, POLICY.reload_grace + 30], 3 * POLICY.ca_lifetime);
        assert!(refused.is_some());
    }

    #[test]
    fn a_reset_bundle_is_mended_first_and_a_steady_state_waits() {
        let ca = Ca {
            id: [1; 32],
            not_before: -BACKDATE,
            not_after: 3_600,
        };
        let stored = Stored {
            bundle: vec![ca.clone()],
            signer: Some(ca.id),
            serving: Some(Serving {
                issuer: Some(ca.id),
                not_before: -BACKDATE,
                not_after: 600,
                names_ok: true,
                key_ok: true,
            }),
        };
        let trusted = vec![vec![ca.id], vec![]];
        let seen = |trusted, now| Observed {
            stored: Ok(&stored),
            trusted,
            now,
        };
        assert_eq!(next(&POLICY, &seen(&trusted, 100)), Step::MendBundles);
        let trusted = vec![vec![ca.id], vec![ca.id]];
        assert_eq!(
            next(&POLICY, &seen(&trusted, 100)),
            Step::Wait { until: 110 }
        );
        // Renewal is due with a third of 600 s (from the issue at 0) left: at 400.
        assert_eq!(
            next(&POLICY, &seen(&trusted, 395)),
            Step::Wait { until: 400 }
        );
        assert!(matches!(
            next(&POLICY, &seen(&trusted, 400)),
            Step::RenewServing { .. }
        ));
        // A CA with a third of its life left gets a successor first.
        assert_eq!(next(&POLICY, &seen(&trusted, 2_400)), Step::AddCa);
        let broken = Observed {
            stored: Err("the Secret has no ca.key"),
            trusted: &trusted,
            now: 0,
        };
        assert!(matches!(next(&POLICY, &broken), Step::Issue { .. }));
    }
}
