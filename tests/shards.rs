//! Shards: a rung of several queues (built in: two a rung with classic
//! queues, one with quorum queues; `Config::bucket_shards`). The router
//! spreads what it places in a rung over the rung's queues, every one of them
//! delivers, and shards a new configuration no longer has are drained and
//! retired like a removed rung.

mod common;
use common::*;
use lapin::types::AMQPValue;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const N: usize = 200;

fn shards(n: u8) -> impl Fn(&mut delay_router::config::Config) {
    move |c| c.bucket_shards = Some(n)
}

/// Publishes `N` messages with a 3 s delay to `q`, each with its own id.
async fn publish_all(h: &Harness, q: &str, from: usize) {
    let mut confirms = Vec::with_capacity(N);
    for i in from..from + N {
        let p = to_queue(q, AMQPValue::LongInt(3_000)).with_message_id(i.to_string().into());
        confirms.push(h.publish_unawaited("k", p, b"sharded").await);
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
}

/// Waits until the queues together hold `n` messages; returns each one's depth.
async fn wait_total(h: &Harness, queues: &[String], n: u32) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut depths = Vec::new();
        for q in queues {
            depths.push(h.depth(q).await);
        }
        if depths.iter().sum::<u32>() >= n {
            return depths;
        }
        assert!(
            Instant::now() < deadline,
            "{queues:?} hold {depths:?}, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Receives until every id from `ids` arrived, asserting none came early;
/// returns how many copies each id got.
async fn receive_all(
    h: &Harness,
    q: &str,
    ids: std::ops::Range<usize>,
    sent: Instant,
) -> BTreeMap<usize, usize> {
    let n = ids.len();
    let got = h.receive(q, n, Duration::from_secs(30)).await;
    let mut copies = BTreeMap::new();
    for (at, d) in &got {
        assert!(
            at.duration_since(sent) >= Duration::from_millis(2_900),
            "a message came after {:?}, before its 3 s",
            at.duration_since(sent)
        );
        *copies.entry(id(d)).or_insert(0) += 1;
    }
    assert_eq!(copies.len(), n, "distinct ids received");
    assert!(copies.keys().all(|i| ids.contains(i)));
    copies
}

#[tokio::test]
async fn a_rung_of_two_queues_takes_half_each_and_both_deliver() {
    // Round-up: the 3 s delay goes to the 3s rung, in one hop.
    let extra = "[placement]\nstrategy = \"round-up\"";
    let mut h = Harness::tuned(&["3s"], extra, shards(2)).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let shards = [
        format!("{}.bucket.3s", h.prefix),
        format!("{}.bucket.3s.1", h.prefix),
    ];
    let sent = Instant::now();
    publish_all(&h, &q, 0).await;
    let depths = wait_total(&h, &shards, N as u32).await;
    // A fair coin for each message: each queue takes 70 to 130 of 200
    // (outside that about once in 10^5 runs).
    for (q, d) in shards.iter().zip(&depths) {
        assert!((70..=130).contains(d), "{q} holds {d} of {N}: {depths:?}");
    }
    let copies = receive_all(&h, &q, 0..N, sent).await;
    assert!(copies.values().all(|&c| c == 1), "duplicates: {copies:?}");
    assert_eq!(h.depth(&shards[0]).await + h.depth(&shards[1]).await, 0);
    h.cleanup().await;
}

#[tokio::test]
async fn fewer_shards_drain_and_retire_the_queues_above() {
    // Classic: the janitor deletes a retired classic bucket once it is
    // empty (a quorum one is left for the operator, tests/quorum.rs).
    let extra = "[topology]\nqueue_type = \"classic\"\n[placement]\nstrategy = \"round-up\"";
    let mut h = Harness::tuned(&["3s"], extra, shards(2)).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let first = format!("{}.bucket.3s", h.prefix);
    let second = format!("{}.bucket.3s.1", h.prefix);
    let sent = Instant::now();
    publish_all(&h, &q, 0).await;
    let depths = wait_total(&h, &[first.clone(), second.clone()], N as u32).await;
    assert!(
        depths[1] > 0,
        "nothing placed in the second queue: {depths:?}"
    );
    // One queue a rung from now on: what waits in the second still arrives,
    // and the second goes once it is empty.
    h.restart_tuned(&["3s"], extra, shards(1)).await;
    assert!(h.exists(&second).await, "retired before it was drained");
    let copies = receive_all(&h, &q, 0..N, sent).await;
    assert!(copies.values().all(|&c| c == 1), "duplicates: {copies:?}");
    h.wait_retired(&[&second], Duration::from_secs(30)).await;
    // New placements use the one queue left.
    let sent = Instant::now();
    publish_all(&h, &q, N).await;
    wait_total(&h, std::slice::from_ref(&first), N as u32).await;
    receive_all(&h, &q, N..2 * N, sent).await;
    h.cleanup().await;
}
