//! Several routers on one prefix, active-active, and failover between nodes:
//! every router consumes ingress and expired; they know of each other
//! (presence), so a router with another ladder never has its buckets deleted
//! by the other's janitor; `status` lists each router with the node its
//! connections use; a router given a list of nodes uses one that answers.

mod common;
use common::*;
use delay_router::router;
use delay_router::router::stats::Stats;
use lapin::types::AMQPValue;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A second in-process router on the harness's prefix, with its own ladder.
struct Second {
    stats: Arc<Stats>,
    /// The buckets its ladder declares, for the harness to remove.
    buckets: Vec<String>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), router::RouterError>>,
}

impl Second {
    fn start(h: &Harness, ladder: &[&str], extra: &str) -> Self {
        let config =
            delay_router::config::Config::from_toml(&config_toml(&h.prefix, ladder, extra))
                .unwrap();
        let buckets = delay_router::core::decision::Rules::from_config(&config)
            .topology()
            .bucket_names()
            .iter()
            .map(|q| q.to_string())
            .collect();
        let stats = Arc::new(Stats::default());
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(router::run_with_stats(
            config,
            async move {
                let _ = rx.await;
            },
            stats.clone(),
        ));
        Self {
            stats,
            buckets,
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("stops")
            .unwrap()
            .unwrap();
    }
}

async fn wait_consumers(h: &Harness, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while h.consumers(h.names.ingress.as_str()).await < n
        || h.consumers(h.names.expired.as_str()).await < n
    {
        assert!(
            Instant::now() < deadline,
            "{n} routers did not start consuming"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn two_routers_share_a_prefix_and_every_message_arrives() {
    const N: usize = 400;
    let mut h = Harness::start(&["1s", "2s"]).await;
    let second = Second::start(&h, &["1s", "2s"], "");
    wait_consumers(&h, 2).await;
    let q = h.queue("dest").await;
    for i in 0..N {
        let delay = (i as i64 * 31) % 3000;
        let p = to_queue(&q, AMQPValue::LongLongInt(delay)).with_message_id(i.to_string().into());
        h.publish("k", p, b"aa").await;
    }
    let duplicates = h.receive_distinct(&q, N, Duration::from_secs(30)).await;
    assert_eq!(duplicates, 0, "no fault, no duplicate");
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);
    let (a, b) = (h.stats.snapshot(), second.stats.snapshot());
    assert!(
        a.delivered > 0 && b.delivered > 0,
        "both routers delivered: {a:?} {b:?}"
    );
    assert_eq!((a.sessions, b.sessions), (1, 1), "no flapping");
    second.stop().await;
    h.cleanup().await;
}

#[tokio::test]
async fn a_router_with_another_ladder_never_deletes_the_running_routers_buckets() {
    // Classic buckets: the janitor deletes only those (a retired quorum
    // bucket is left for the operator, tests/quorum.rs).
    const EXTRA: &str = "[topology]\nqueue_type = \"classic\"";
    let mut h = Harness::new(&["1s", "2s"], EXTRA).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let two = format!("{}.bucket.2s", h.prefix);
    // The second router's ladder has no 2s rung, not even as a multiple
    // or on the grid (cascade adds 3s-7500ms and 750ms, 375ms; a grid only
    // below a rung over 2 s): for it, 2s is retired.
    let second = Second::start(&h, &["1500ms"], EXTRA);
    wait_consumers(&h, 2).await;
    // While both run, the first places into 2s now and then, so that the
    // bucket is sometimes empty, for longer than several sweeps of the
    // second's janitor (every 5 s).
    let until = Instant::now() + Duration::from_secs(16);
    let mut sent = 0;
    let mut next = Instant::now();
    while Instant::now() < until {
        if Instant::now() >= next {
            let p = to_queue(&q, AMQPValue::LongInt(2100)).with_message_id(sent.to_string().into());
            h.publish("k", p, b"ladders").await;
            sent += 1;
            next += Duration::from_secs(3);
        }
        assert!(
            h.exists(&two).await,
            "the 2s bucket was deleted while in use"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    h.receive_distinct(&q, sent, Duration::from_secs(30)).await;
    assert_eq!(
        h.stats.snapshot().sessions,
        1,
        "the first router never reconnected"
    );
    assert_eq!(second.stats.snapshot().sessions, 1);
    // Once the first stops (its presence expires after 3 checks of 5 s),
    // the second removes the retired bucket.
    h.stop_router().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(45);
    while h.exists(&two).await {
        assert!(
            Instant::now() < deadline,
            "the retired bucket was never removed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let buckets = second.buckets.clone();
    second.stop().await;
    for q in &buckets {
        h.track_queue(q);
    }
    h.cleanup().await;
}

#[tokio::test]
async fn status_lists_each_router_with_its_node_and_the_brokers_version() {
    let h = Harness::start(&["1s"]).await;
    let second = Second::start(&h, &["1s"], "");
    wait_consumers(&h, 2).await;
    let config =
        delay_router::config::Config::from_toml(&config_toml(&h.prefix, &["1s"], "")).unwrap();
    let status = delay_router::commands::status::collect(&config)
        .await
        .unwrap();
    assert_eq!(status.routers.len(), 2, "{status:?}");
    assert!(status.broker.starts_with("RabbitMQ "), "{}", status.broker);
    for r in &status.routers {
        assert_eq!(r.consume_node, config.url.to_string());
        assert_eq!(r.broker, status.broker);
        assert!(r.buckets.iter().any(|b| b.ends_with(".bucket.1s")));
    }
    let text = delay_router::commands::status::render(&config, &status);
    assert!(text.contains("running: 2 router(s) consuming"), "{text}");
    // The first line names the type the routers declare (learned, under auto).
    let first = text.lines().next().unwrap();
    let declared = &status.routers[0].queue_type;
    assert!(
        ["classic", "quorum"].contains(&declared.as_str()),
        "{status:?}"
    );
    assert!(
        first.contains(&format!("queues {}", config.queue_type)),
        "{first}"
    );
    assert!(first.contains(declared.as_str()), "{first}");
    assert!(
        text.contains(&format!("consumes from {}", config.url)),
        "{text}"
    );
    assert!(!text.contains(":guest@"), "no password: {text}");
    second.stop().await;
    h.cleanup().await;
}

#[tokio::test]
async fn a_router_given_several_nodes_uses_one_that_answers() {
    // Nothing listens on port 9 of this host: that node is down.
    let down = url()
        .replace("127.0.0.1:5672", "127.0.0.1:9")
        .replace("127.0.0.1:5682", "127.0.0.1:9");
    let extra = format!("[amqp]\nurls = [\"{down}\", \"{}\", \"{down}\"]", url());
    let mut h = Harness::new(&["1s"], &extra).await;
    for _ in 0..3 {
        h.start_router().await;
        let q = h.queue(&format!("dest-{}", rand::random::<u16>())).await;
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongInt(300)).with_message_id("1".into()),
            b"up",
        )
        .await;
        h.receive(&q, 1, Duration::from_secs(15)).await;
        h.stop_router().await.unwrap();
    }
    h.cleanup().await;
}
