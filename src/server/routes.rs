//! HTTP routing for the webhook port and the admin port. Plain async functions over
//! `Request<B>`, so tests drive them in-process.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper::body::Body;

use crate::engine::config::Injector;
use crate::engine::inject::Entry;
use crate::engine::memo::Memo;
use crate::engine::review::{self, Outcome, Webhook};
use crate::server::metrics::Metrics;

/// What the request handlers share.
#[derive(Debug)]
pub struct State {
    pub injector: ArcSwap<Injector>,
    /// Recent answers, by body: a replica like one just answered is not reviewed again.
    pub memo: Memo,
    pub metrics: Metrics,
    /// Set on SIGTERM: readiness fails at once so the endpoint is taken out of rotation.
    pub draining: AtomicBool,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    /// Signalled after a new configuration is served (`serve --backstop` follows it).
    pub config_changed: tokio::sync::Notify,
}

impl State {
    /// `memo_entries`: how many recent answers to keep (0: none).
    pub fn new(
        injector: Injector,
        max_body_bytes: usize,
        request_timeout: Duration,
        memo_entries: usize,
    ) -> Self {
        Self {
            injector: ArcSwap::from_pointee(injector),
            memo: Memo::new(memo_entries),
            metrics: Metrics::default(),
            draining: AtomicBool::new(false),
            max_body_bytes,
            request_timeout,
            config_changed: tokio::sync::Notify::new(),
        }
    }
}

pub type HttpResponse = Response<Full<Bytes>>;

fn text(status: StatusCode, body: impl Into<Bytes>) -> HttpResponse {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn reject(state: &State, status: StatusCode, message: impl Into<String>) -> HttpResponse {
    state.metrics.rejected(status.as_u16());
    let mut message = message.into();
    message.push('\n');
    text(status, message)
}

fn method_not_allowed(state: &State, allow: &'static str) -> HttpResponse {
    let mut response = reject(
        state,
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed; use {allow}"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// The webhook port: `POST /mutate` and `POST /validate`.
pub async fn webhook<B>(state: Arc<State>, req: Request<B>) -> HttpResponse
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let Some((webhook, entry)) = review::route(req.uri().path()) else {
        let paths: Vec<&str> = review::PATHS.iter().map(|(p, _, _)| *p).collect();
        return reject(
            &state,
            StatusCode::NOT_FOUND,
            format!(
                "no such path {:?}; use {}",
                req.uri().path(),
                paths.join(", ")
            ),
        );
    };
    if req.method() != Method::POST {
        return method_not_allowed(&state, "POST");
    }
    let limit = state.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return too_large(&state);
    }
    let body = match tokio::time::timeout(
        state.request_timeout,
        Limited::new(req.into_body(), limit).collect(),
    )
    .await
    {
        Err(_) => {
            return reject(
                &state,
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time",
            );
        }
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return too_large(&state);
        }
        Ok(Err(error)) => {
            return reject(
                &state,
                StatusCode::BAD_REQUEST,
                format!("cannot read request body: {error}"),
            );
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    review_body(&state, webhook, entry, &body)
}

fn too_large(state: &State) -> HttpResponse {
    let limit = state.max_body_bytes;
    reject(
        state,
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body is larger than the {limit}-byte limit"),
    )
}

/// Answers a complete body. Runs the pure core; a panic in it (a bug) becomes a 500, never a
/// dropped connection.
///
/// The review's identity goes on the events a review logs (a denial, an error; each answer at
/// debug), not on a span: an enabled span is formatted on creation and formatted again for every
/// field recorded later, which cost more than the whole review (about 9 µs a request with JSON
/// logs) although nothing is logged for an allowed pod at the default level.
fn review_body(state: &State, webhook: Webhook, entry: Entry, body: &[u8]) -> HttpResponse {
    let started = Instant::now();
    let injector = state.injector.load();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let (answer, recall) = state.memo.answer(&injector, webhook, entry, body);
        state.metrics.recall(recall);
        answer
    }));
    let elapsed = started.elapsed().as_secs_f64();
    let (webhook_name, entry_name) = (webhook.as_str(), entry.as_str());
    match result {
        Ok(Ok(answer)) => {
            state.metrics.review(webhook, answer.outcome, elapsed);
            state.metrics.injected(&answer.injected);
            let s = &answer.summary;
            macro_rules! log {
                ($level:ident, $message:literal) => {
                    tracing::$level!(
                        webhook = webhook_name,
                        entry = entry_name,
                        uid = s.uid(),
                        namespace = s.namespace(),
                        name = s.name(),
                        operation = s.operation(),
                        outcome = answer.outcome.as_str(),
                        $message
                    )
                };
            }
            match answer.outcome {
                Outcome::Denied => log!(info, "review denied"),
                Outcome::Error => log!(warn, "review failed"),
                _ => log!(debug, "review answered"),
            }
            let mut response = Response::new(Full::new(Bytes::from(answer.body)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Ok(Err(error)) => {
            state.metrics.review(webhook, Outcome::Error, elapsed);
            tracing::warn!(
                webhook = webhook_name,
                entry = entry_name,
                outcome = Outcome::Error.as_str(),
                %error,
                "unreadable review"
            );
            reject(state, StatusCode::BAD_REQUEST, error.to_string())
        }
        Err(_) => {
            state.metrics.review(webhook, Outcome::Error, elapsed);
            tracing::error!(
                webhook = webhook_name,
                entry = entry_name,
                outcome = Outcome::Error.as_str(),
                "review panicked: this is a bug"
            );
            reject(
                state,
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error while reviewing",
            )
        }
    }
}

/// The admin port: `GET /livez`, `GET /readyz`, `GET /metrics`.
pub fn admin<B>(state: &State, req: &Request<B>) -> HttpResponse {
    let path = req.uri().path();
    if !matches!(path, "/livez" | "/readyz" | "/metrics") {
        return reject(
            state,
            StatusCode::NOT_FOUND,
            format!("no such path {path:?}; use /livez, /readyz or /metrics"),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return method_not_allowed(state, "GET");
    }
    match path {
        "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" if state.draining.load(Ordering::SeqCst) => {
            text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
        }
        "/readyz" => text(StatusCode::OK, "ok\n"),
        _ => {
            let mut response = text(StatusCode::OK, state.metrics.encode());
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
    }
}
