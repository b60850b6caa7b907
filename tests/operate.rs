//! Operating the router: `/metrics` scraped with a Prometheus text parser
//! after known traffic, and `/healthz` and `/readyz` while the broker goes
//! away and comes back.

mod common;

use common::*;
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

fn metrics_extra(port: u16) -> String {
    format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")
}

/// One queue a rung (the tests read one bucket's depth), and the topology
/// checked every 200 ms (the gauges it refreshes).
fn one_queue_fast_checks(c: &mut delay_router::config::Config) {
    c.bucket_shards = Some(1);
    c.check_interval = Duration::from_millis(200);
}

async fn until_scraped(
    port: u16,
    within: Duration,
    done: impl Fn(&prometheus_parse::Scrape) -> bool,
) -> prometheus_parse::Scrape {
    let deadline = Instant::now() + within;
    loop {
        let s = scrape(port).await;
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "metrics never showed it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn histogram<'a>(
    s: &'a prometheus_parse::Scrape,
    name: &str,
) -> &'a [prometheus_parse::HistogramCount] {
    s.samples
        .iter()
        .find_map(|x| match &x.value {
            prometheus_parse::Value::Histogram(h) if x.metric == name => Some(h.as_slice()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("histogram {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_known_traffic() {
    let port = free_port();
    let mut h = Harness::tuned(&["1s", "4s"], &metrics_extra(port), one_queue_fast_checks).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    // 4 delivered at once or after a short wait (timed by the router), 3 waiting in the 4s bucket
    // a while, 2 parked for a stated reason.
    for (i, delay) in [0, 300, 1000, 1500].into_iter().enumerate() {
        let p = to_queue(&q, AMQPValue::LongLongInt(delay)).with_message_id(i.to_string().into());
        h.publish("k", p, b"x").await;
    }
    for i in 0..3 {
        let p = to_queue(&q, s("4s")).with_message_id(format!("w{i}").into());
        h.publish("k", p, b"w").await;
    }
    h.publish("k", to_queue(&q, s("soon")), b"bad").await;
    let no_delay =
        BasicProperties::default().with_headers(headers(&[("x-original-exchange", s(""))]));
    h.publish("k", no_delay, b"none").await;

    let bucket = format!("{}.bucket.4s", h.prefix);
    let waiting = until_scraped(port, Duration::from_secs(10), |s| {
        sample(s, "delay_router_bucket_messages", &[("bucket", &bucket)]) == Some(3.0)
    })
    .await;
    assert_eq!(
        sample(&waiting, "delay_router_messages_received_total", &[]),
        Some(9.0)
    );
    assert_eq!(sample(&waiting, "delay_router_ready", &[]), Some(1.0));
    let node = waiting
        .samples
        .iter()
        .find(|x| x.metric == "delay_router_connected_node")
        .expect("the connected node");
    assert!(
        node.labels.get("broker").unwrap().starts_with("RabbitMQ"),
        "{node:?}"
    );

    h.receive(&q, 7, Duration::from_secs(20)).await;
    let s = until_scraped(port, Duration::from_secs(10), |s| {
        sample(s, "delay_router_messages_delivered_total", &[]) == Some(7.0)
            && sample(s, "delay_router_bucket_messages", &[("bucket", &bucket)]) == Some(0.0)
    })
    .await;
    let parked = |reason| {
        sample(
            &s,
            "delay_router_messages_parked_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(parked("invalid_delay"), Some(1.0));
    assert_eq!(parked("missing_delay"), Some(1.0));
    assert_eq!(parked("unroutable"), Some(0.0));
    let parked_depth = sample(&s, "delay_router_queue_messages", &[("role", "parked")]);
    assert_eq!(parked_depth, Some(2.0));
    // The histogram: +Inf holds every observation, its count the delivered.
    let lateness = histogram(&s, "delay_router_delivery_lateness_seconds");
    let inf = lateness.last().unwrap();
    assert!(inf.less_than.is_infinite());
    assert_eq!(inf.count, 7.0);
    assert_eq!(
        sample(&s, "delay_router_delivery_lateness_seconds_count", &[]),
        Some(7.0)
    );
    assert_eq!(lateness.first().unwrap().less_than, 0.001);
    assert_eq!(lateness[lateness.len() - 2].less_than, 3600.0);
    // Never early, and on this idle broker none a whole second late.
    let within_1s = lateness.iter().find(|b| b.less_than == 1.0).unwrap();
    assert_eq!(within_1s.count, 7.0, "{lateness:?}");
    // The broker's share: the three that waited in the 4s bucket came back
    // from it due for delivery, each observed once; the four timed by the
    // router never entered a bucket.
    let returned = histogram(&s, "delay_router_return_lateness_seconds");
    assert_eq!(returned.last().unwrap().count, 3.0, "{returned:?}");
    let returned_within_1s = returned.iter().find(|b| b.less_than == 1.0).unwrap();
    assert_eq!(returned_within_1s.count, 3.0, "{returned:?}");
    assert_eq!(
        histogram(&s, "delay_router_delivery_hops")
            .last()
            .unwrap()
            .count,
        7.0
    );
    assert_eq!(
        sample(&s, "delay_router_in_flight_messages", &[]),
        Some(0.0)
    );
    // The three under 2 s were timed by the router itself, no bucket.
    assert!(sample(&s, "delay_router_messages_placed_total", &[]).unwrap() >= 3.0);
    assert!(sample(&s, "delay_router_messages_held_total", &[]).unwrap() >= 3.0);
    // Every publish's confirm is timed.
    let timed = sample(&s, "delay_router_publish_confirm_seconds_count", &[]).unwrap();
    assert!(timed >= 12.0, "{timed} timed");
    // Two pipelines (ingress, expired), each letting at least 32 and at most
    // its prefetch window of publishes be unconfirmed at once.
    let window = sample(&s, "delay_router_publish_window_messages", &[]).unwrap();
    assert!((32.0..=1000.0).contains(&window), "publish window {window}");
    // No fault, so nothing left unpublished.
    assert_eq!(
        sample(&s, "delay_router_deliveries_abandoned_total", &[]),
        Some(0.0)
    );
    // Every source delivery is acked (the broker's count), within the ack's
    // linger.
    for role in ["ingress", "expired"] {
        let queue = format!("{}.{role}", h.prefix);
        let started = std::time::Instant::now();
        while unacked(&queue) != Some(0) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{queue}: {:?} unacked",
                unacked(&queue)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    h.cleanup().await;
}

/// Deliveries unacknowledged on `queue`, as the broker counts them.
fn unacked(queue: &str) -> Option<u64> {
    rabbitmqctl(&["list_queues", "-q", "name", "messages_unacknowledged"])
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .find(|(name, _)| *name == queue)
        .and_then(|(_, n)| n.trim().parse().ok())
}

/// A TCP proxy to the broker the test can cut and restore.
struct Proxy {
    port: u16,
    upstream: String,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    async fn start() -> Self {
        let url = url();
        let host_port = url
            .rsplit_once('@')
            .map_or(url.as_str(), |(_, rest)| rest)
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let mut p = Self {
            port: free_port(),
            upstream: host_port,
            tasks: Arc::default(),
            acceptor: None,
        };
        p.open().await;
        p
    }

    async fn open(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        let (tasks, upstream) = (self.tasks.clone(), self.upstream.clone());
        self.acceptor = Some(tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tasks.lock().unwrap().push(task);
            }
        }));
    }

    /// Refuses new connections and cuts the open ones.
    fn cut(&mut self) {
        if let Some(a) = self.acceptor.take() {
            a.abort();
        }
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    fn url(&self) -> String {
        url().replace(&self.upstream, &format!("127.0.0.1:{}", self.port))
    }
}

async fn until_status(url: &str, want: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some((status, body)) = http_get(url).await
            && status == want
        {
            return body;
        }
        assert!(Instant::now() < deadline, "{url} never answered {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_flips_when_the_broker_goes_away_and_back() {
    let mut proxy = Proxy::start().await;
    let port = free_port();
    let extra = format!("[amqp]\nurl = \"{}\"\n{}", proxy.url(), metrics_extra(port));
    let mut h = Harness::tuned(&["1s"], &extra, one_queue_fast_checks).await;
    h.start_router().await;
    let (healthz, readyz) = (
        format!("http://127.0.0.1:{port}/healthz"),
        format!("http://127.0.0.1:{port}/readyz"),
    );
    assert_eq!(
        until_status(&readyz, 200, Duration::from_secs(10)).await,
        "ready\n"
    );
    assert_eq!(http_get(&healthz).await, Some((200, "ok\n".into())));

    proxy.cut();
    let why = until_status(&readyz, 503, Duration::from_secs(15)).await;
    assert!(why.starts_with("not ready: "), "{why}");
    assert_eq!(why.lines().count(), 1, "{why}");
    // The reason names the lost session at once (not a vague "ending").
    assert!(why.contains("broker session lost"), "{why}");
    // It stays away a while: the router keeps retrying, never exits.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = http_get(&readyz).await.expect("still serving");
    assert_eq!(still.0, 503, "{still:?}");
    assert!(still.1.contains("broker session lost"), "{still:?}");
    assert_eq!(http_get(&healthz).await, Some((200, "ok\n".into())));
    let s = scrape(port).await;
    assert_eq!(sample(&s, "delay_router_ready", &[]), Some(0.0));
    // The lost session is counted once it has wound down (its side tasks
    // stopped, connections closed): milliseconds on a quiet machine, more
    // on a loaded one, at most RPC_TIMEOUT.
    let deadline = Instant::now() + Duration::from_secs(20);
    while sample(&scrape(port).await, "delay_router_reconnects_total", &[]).unwrap() < 1.0 {
        assert!(Instant::now() < deadline, "no reconnect counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    proxy.open().await;
    until_status(&readyz, 200, Duration::from_secs(60)).await;
    let s = scrape(port).await;
    assert_eq!(sample(&s, "delay_router_ready", &[]), Some(1.0));
    assert!(sample(&s, "delay_router_sessions_total", &[]).unwrap() >= 2.0);
    // And it routes again.
    let q = h.queue("dest").await;
    h.publish("k", to_queue(&q, AMQPValue::LongLongInt(100)), b"x")
        .await;
    h.receive(&q, 1, Duration::from_secs(10)).await;
    proxy.cut();
    let result = h.stop_router().await;
    assert!(result.is_ok(), "{result:?}");
    h.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_metrics_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut h = Harness::tuned(&["1s"], &metrics_extra(port), one_queue_fast_checks).await;
    let config = h.config.clone();
    let ran = tokio::time::timeout(
        Duration::from_secs(10),
        delay_router::router::run(config, std::future::pending()),
    )
    .await
    .expect("fails at once");
    let e = ran.expect_err("the port is taken").to_string();
    assert!(
        e.contains(&format!("127.0.0.1:{port}")) && e.contains("[metrics] listen"),
        "{e}"
    );
    let _ = h.stop_router().await;
    h.cleanup().await;
}
