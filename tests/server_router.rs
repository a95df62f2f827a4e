//! In-process router tests: every path, method and bad input of both ports, via `oneshot`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod server_support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full, StreamBody};
use proptest::prelude::*;
use sidecar_injector::config::Injector;
use sidecar_injector::review::{Webhook, answer, answer_for};
use sidecar_injector::server::routes::{self, State};
use tower::ServiceExt as _;

fn state() -> Arc<State> {
    Arc::new(State::new(
        Injector::embedded(None).unwrap(),
        256 * 1024,
        Duration::from_millis(500),
        sidecar_injector::memo::DEFAULT_ENTRIES,
    ))
}

async fn call<B>(state: &Arc<State>, req: Request<B>) -> (StatusCode, http::HeaderMap, Bytes)
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let state = state.clone();
    let svc = tower::service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(routes::webhook(state, req).await) }
    });
    let response = svc.oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

fn post(path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(path).body(Full::new(body.into())).unwrap()
}

#[tokio::test]
async fn mutate_answers_the_same_bytes_as_review() {
    let s = state();
    let body = server_support::review("uid-1");
    let (status, headers, bytes) = call(&s, post("/mutate", body.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    let expected = answer(&Injector::embedded(None).unwrap(), Webhook::Mutate, &body)
        .unwrap()
        .body;
    assert_eq!(bytes, expected);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["response"]["uid"], "uid-1");
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    assert!(
        s.metrics
            .encode()
            .contains(r#"sidecar_injector_reviews_total{webhook="mutate",outcome="injected"} 1"#)
    );
}

/// Each injection counts once per template, labelled with the template's hash; validation and
/// pods that are not injected count nothing.
#[tokio::test]
async fn a_replica_is_answered_from_memory_with_the_bytes_a_review_writes() {
    let s = state();
    let inj = Injector::embedded(None).unwrap();
    // Kept the second time it comes, recalled from the third.
    for (uid, result) in [
        ("uid-1", "miss"),
        ("uid-2", "miss"),
        ("uid-3", "hit"),
        ("uid-4", "hit"),
    ] {
        let body = server_support::review(uid);
        let (status, _, bytes) = call(&s, post("/mutate", body.clone())).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(bytes, answer(&inj, Webhook::Mutate, &body).unwrap().body);
        let line = format!(r#"sidecar_injector_review_memo_total{{result="{result}"}}"#);
        assert!(s.metrics.encode().contains(&line), "{line}");
    }
    let metrics = s.metrics.encode();
    assert!(metrics.contains(r#"sidecar_injector_review_memo_total{result="hit"} 2"#));
    assert!(
        metrics
            .contains(r#"sidecar_injector_reviews_total{webhook="mutate",outcome="injected"} 4"#)
    );
    // A reload starts the memory over.
    s.injector
        .store(Arc::new(Injector::embedded(None).unwrap()));
    s.memo.clear();
    let body = server_support::review("uid-5");
    let (_, _, bytes) = call(&s, post("/mutate", body.clone())).await;
    assert_eq!(bytes, answer(&inj, Webhook::Mutate, &body).unwrap().body);
    assert!(
        s.metrics
            .encode()
            .contains(r#"sidecar_injector_review_memo_total{result="miss"} 3"#)
    );
}

#[tokio::test]
async fn injections_are_counted_per_template_and_hash() {
    let s = state();
    let inj = Injector::embedded(None).unwrap();
    for uid in ["a", "b"] {
        call(&s, post("/mutate", server_support::review(uid))).await;
    }
    call(&s, post("/validate", server_support::review("c"))).await;
    let metrics = s.metrics.encode();
    for template in ["log-shipper", "proxy"] {
        let hash = inj.templates.hash(template);
        assert_eq!(hash.len(), 16);
        let line = format!(
            r#"sidecar_injector_injections_total{{template="{template}",template_hash="{hash}"}} 2"#
        );
        assert!(metrics.contains(&line), "{line} missing from {metrics}");
    }
    assert_eq!(
        metrics
            .matches("sidecar_injector_injections_total{")
            .count(),
        2,
        "{metrics}"
    );
}

#[tokio::test]
async fn validate_denies_an_uninjected_opted_in_pod() {
    let (status, _, bytes) =
        call(&state(), post("/validate", server_support::review("uid-2"))).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(v["response"]["status"]["code"], 403);
}

/// The namespace entry's paths answer as `review::answer_for` with that entry: a pod without
/// the label is injected on /mutate/namespace and left alone on /mutate.
#[tokio::test]
async fn the_namespace_paths_answer_for_the_namespace_entry() {
    let s = state();
    let inj = Injector::embedded(None).unwrap();
    let mut review: serde_json::Value =
        serde_json::from_slice(&server_support::review("uid-ns")).unwrap();
    review["request"]["object"]["metadata"]["labels"] = serde_json::json!({"app": "web"});
    let body = serde_json::to_vec(&review).unwrap();
    for (path, webhook, entry) in sidecar_injector::review::PATHS {
        let (status, _, bytes) = call(&s, post(path, body.clone())).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let expected = answer_for(&inj, webhook, entry, &body).unwrap().body;
        assert_eq!(bytes, expected, "{path}");
    }
    let (_, _, bytes) = call(&s, post("/mutate/namespace", body.clone())).await;
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["response"]["patchType"], "JSONPatch", "{v}");
    let (_, _, bytes) = call(&s, post("/mutate", body)).await;
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert!(v["response"].get("patch").is_none(), "{v}");
    let (status, _, bytes) = call(&s, post("/mutate/other", "{}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&bytes).contains("/validate/namespace"));
}

/// The required entry's paths: a pod that opts out is left alone on /mutate/required and
/// refused on /validate/required (where /validate/namespace admits it), with the sentence
/// that names its namespace; one that does not opt out is injected on /mutate/required.
#[tokio::test]
async fn the_required_paths_answer_for_the_required_entry() {
    let s = state();
    let mut review: serde_json::Value =
        serde_json::from_slice(&server_support::review("uid-req")).unwrap();
    review["request"]["namespace"] = "shop".into();
    review["request"]["object"]["metadata"]["labels"] =
        serde_json::json!({"app": "web", "sidecar-injector.io/inject": "false"});
    let opted_out = serde_json::to_vec(&review).unwrap();
    let json = |bytes: &Bytes| serde_json::from_slice::<serde_json::Value>(bytes).unwrap();
    let (status, _, bytes) = call(&s, post("/mutate/required", opted_out.clone())).await;
    assert_eq!(status, StatusCode::OK);
    let v = json(&bytes);
    assert_eq!(v["response"]["allowed"], true, "{v}");
    assert!(v["response"].get("patch").is_none(), "{v}");
    let (_, _, bytes) = call(&s, post("/validate/required", opted_out.clone())).await;
    let v = json(&bytes);
    assert_eq!(v["response"]["allowed"], false, "{v}");
    assert_eq!(v["response"]["status"]["code"], 403, "{v}");
    let message = v["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("its namespace \"shop\" requires sidecars")
            && message.contains("required.exempt"),
        "{message}"
    );
    let (_, _, bytes) = call(&s, post("/validate/namespace", opted_out)).await;
    assert_eq!(json(&bytes)["response"]["allowed"], true);

    review["request"]["object"]["metadata"]["labels"] = serde_json::json!({"app": "web"});
    let plain = serde_json::to_vec(&review).unwrap();
    let (_, _, bytes) = call(&s, post("/mutate/required", plain)).await;
    assert_eq!(json(&bytes)["response"]["patchType"], "JSONPatch");
    let (_, _, bytes) = call(&s, post("/mutate/other", "{}")).await;
    assert!(String::from_utf8_lossy(&bytes).contains("/validate/required"));
}

#[tokio::test]
async fn unknown_path_is_404_and_wrong_method_is_405() {
    let s = state();
    assert_eq!(call(&s, post("/nope", "{}")).await.0, StatusCode::NOT_FOUND);
    let get = Request::get("/mutate")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, _) = call(&s, get).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers[header::ALLOW], "POST");
    let put = Request::builder()
        .method(Method::PUT)
        .uri("/validate")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(call(&s, put).await.0, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn unreadable_bodies_are_400_with_a_reason() {
    let s = state();
    let full = server_support::review("uid-3");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            full[..full.len() / 2].to_vec(),
            "not a readable AdmissionReview",
        ),
        (
            "deep nesting",
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
            "not a readable AdmissionReview",
        ),
        (
            "non-UTF-8",
            vec![0xff, 0xfe, 0x00, 0x7b],
            "not a readable AdmissionReview",
        ),
        (
            "no request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            "no request",
        ),
        (
            "wrong version",
            br#"{"apiVersion":"v9","kind":"AdmissionReview","request":null}"#.to_vec(),
            "apiVersion",
        ),
        ("empty", Vec::new(), "not a readable AdmissionReview"),
    ];
    for (name, body, reason) in cases {
        let (status, _, bytes) = call(&s, post("/mutate", body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}");
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains(reason), "{name}: {text}");
    }
    // Still serving after all of that.
    assert_eq!(call(&s, post("/mutate", full)).await.0, StatusCode::OK);
}

#[tokio::test]
async fn deep_nesting_inside_a_review_is_refused_with_its_uid() {
    let body = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"deep","object":{{"metadata":{{"managedFields":[{{"fieldsV1":{}{}}}]}}}}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let (status, _, bytes) = call(&state(), post("/mutate", body)).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["response"]["uid"], "deep");
    assert_eq!(v["response"]["allowed"], false);
    assert!(
        v["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("recursion limit"),
        "{v}"
    );
}

#[tokio::test]
async fn a_readable_uid_gets_a_refusal_the_api_server_can_show() {
    let body = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u-9","object":{"spec":{"containers":"not a list"}}}}"#;
    let (status, _, bytes) = call(&state(), post("/mutate", body.to_vec())).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(v["response"]["uid"], "u-9");
    assert_eq!(v["response"]["allowed"], false);
    assert!(
        v["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot read")
    );
}

#[tokio::test]
async fn oversized_bodies_are_413_declared_or_not() {
    let s = state();
    let big = vec![b' '; 256 * 1024 + 1];
    let (status, _, _) = call(&s, post("/mutate", big.clone())).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    // Streamed without a Content-Length: the limit applies while reading.
    let chunks = big
        .chunks(4096)
        .map(|c| Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::copy_from_slice(c))))
        .collect::<Vec<_>>();
    let body = StreamBody::new(futures_stream(chunks));
    let req = Request::post("/mutate").body(body).unwrap();
    assert_eq!(call(&s, req).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    let req = Request::post("/mutate")
        .header(header::CONTENT_LENGTH, "999999999")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(call(&s, req).await.0, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_body_that_never_ends_times_out() {
    let s = state();
    let (_tx, rx) = tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, Infallible>>(1);
    let body = StreamBody::new(tokio_stream(rx));
    let req = Request::post("/mutate").body(body).unwrap();
    assert_eq!(call(&s, req).await.0, StatusCode::REQUEST_TIMEOUT);
}

#[tokio::test]
async fn admin_paths() {
    let s = state();
    let get = |path: &str| Request::get(path).body(()).unwrap();
    let status = |req: Request<()>| routes::admin(&s, &req).status();
    assert_eq!(status(get("/livez")), StatusCode::OK);
    assert_eq!(status(get("/readyz")), StatusCode::OK);
    assert_eq!(status(get("/metrics")), StatusCode::OK);
    assert_eq!(status(get("/other")), StatusCode::NOT_FOUND);
    assert_eq!(
        status(Request::post("/livez").body(()).unwrap()),
        StatusCode::METHOD_NOT_ALLOWED
    );
    let metrics = routes::admin(&s, &get("/metrics"))
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let metrics = String::from_utf8_lossy(&metrics);
    for name in [
        "sidecar_injector_build_info",
        "sidecar_injector_certificate_expiry_timestamp_seconds",
        "sidecar_injector_http_rejections_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from {metrics}");
    }
    s.draining.store(true, Ordering::SeqCst);
    assert_eq!(status(get("/readyz")), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(status(get("/livez")), StatusCode::OK);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    /// Arbitrary bytes never panic the router and get a 200 or a 400.
    #[test]
    fn arbitrary_bodies_get_200_or_400(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (status, _, _) = rt.block_on(call(&state(), post("/mutate", body)));
        prop_assert!(status == StatusCode::OK || status == StatusCode::BAD_REQUEST, "{status}");
    }

    /// Valid reviews with arbitrary uids and labels always answer 200 with the uid echoed.
    #[test]
    fn valid_reviews_echo_their_uid(uid in "[a-z0-9-]{1,36}", inject in any::<bool>()) {
        let mut review: serde_json::Value = serde_json::from_slice(&server_support::review(&uid)).unwrap();
        if !inject {
            review["request"]["object"]["metadata"]["labels"] = serde_json::json!({});
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (status, _, bytes) = rt.block_on(call(&state(), post("/mutate", serde_json::to_vec(&review).unwrap())));
        prop_assert_eq!(status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(v["response"]["uid"].as_str(), Some(uid.as_str()));
        prop_assert_eq!(v["response"]["patch"].is_string(), inject);
    }
}

// Minimal streams over a Vec and an mpsc receiver.
fn futures_stream<T: Unpin>(items: Vec<T>) -> streams::Iter<std::vec::IntoIter<T>> {
    streams::Iter(items.into_iter())
}

fn tokio_stream<T>(rx: tokio::sync::mpsc::Receiver<T>) -> streams::Recv<T> {
    streams::Recv(rx)
}

mod streams {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub struct Iter<I>(pub I);
    impl<I: Iterator + Unpin> futures_core::Stream for Iter<I> {
        type Item = I::Item;
        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Ready(self.0.next())
        }
    }

    pub struct Recv<T>(pub tokio::sync::mpsc::Receiver<T>);
    impl<T> futures_core::Stream for Recv<T> {
        type Item = T;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
            self.0.poll_recv(cx)
        }
    }
}
