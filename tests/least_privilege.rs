//! The whole router as a least-privilege broker user, with the permissions
//! `delay-router permissions` prints: the binary declares its topology,
//! places, delivers, retries a rejected message, parks, removes a retired
//! bucket, and answers `status` and `parked`; a publisher with write on the
//! router exchange only can use it, and cannot write into a bucket.

mod common;
use common::*;
use delay_router::config::Config;
use delay_router::core::security::Permissions;
use lapin::options::*;
use lapin::types::AMQPValue;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::process::Command;
use std::time::Duration;

fn extra(prefix: &str, router: &BrokerUser) -> String {
    format!(
        "[amqp]\nurl = \"{}\"\n[security]\nallow_destinations = [\"\", \"{prefix}.orders\"]\n\
         [[policy]]\nqueue = \"{prefix}.work\"\ninitial = \"500ms\"\nmax_attempts = 3\n",
        router.amqp_url()
    )
}

fn cli(args: &[&str], path: &std::path::Path) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_whole_router_runs_as_a_least_privilege_user() {
    let prefix = random_prefix();
    // The router's user gets exactly what `delay-router permissions` prints.
    let placeholder = BrokerUser::create(&prefix, "router", ["", "", ""]);
    let path = write_config(&prefix, &["1s", "2s"], &extra(&prefix, &placeholder));
    let config = Config::load(&path).unwrap();
    let router_perms = Permissions::router(
        &delay_router::core::topology::Names::new(&prefix),
        config.allow_destinations.as_ref(),
    );
    let (ok, printed, err) = cli(&["permissions", "--publisher", "app"], &path);
    assert!(ok, "{err}");
    let vhost = config.url.vhost().to_owned();
    assert!(
        printed.contains(&router_perms.command(&vhost, &placeholder.name)),
        "{printed}"
    );
    let router = placeholder;
    rabbitmqctl(&[
        "set_permissions",
        "-p",
        &vhost,
        &router.name,
        &router_perms.configure,
        &router_perms.write,
        &router_perms.read,
    ]);
    let names = delay_router::core::topology::Names::new(&prefix);
    let p = Permissions::publisher(&names);
    assert!(printed.contains(&p.command(&vhost, "app")), "{printed}");
    let publisher = BrokerUser::create(&prefix, "app", [&p.configure, &p.write, &p.read]);

    let mut h = Harness::with_prefix(&prefix, &["1s", "2s"], &extra(&prefix, &router)).await;
    let orders = h.exchange("orders").await;
    let forbidden = h.exchange("elsewhere").await;
    let q = h.queue("orders-q").await;
    h.bind(&q, &orders, "eu").await;
    h.bind(&q, &forbidden, "eu").await;
    let direct = h.queue("direct-q").await;
    let work = h.work_queue().await;
    h.bind(&work, &orders, "work").await;

    // Declares as that user, then a first run on a two-rung ladder.
    let (ok, out, err) = cli(&["declare"], &path);
    assert!(ok, "declare as the router's user: {out}{err}");
    let log = std::env::temp_dir().join(format!("{prefix}.log"));
    let mut run = spawn_binary(&path, &log);
    h.wait_consumers().await;

    let pub_conn = Connection::connect(&publisher.amqp_url(), ConnectionProperties::default())
        .await
        .expect("the publisher connects");
    let pub_ch = pub_conn.create_channel().await.unwrap();
    pub_ch
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let publish = |props: BasicProperties, body: &'static [u8]| {
        let ch = pub_ch.clone();
        let router_exchange = h.names.router_exchange.clone();
        async move {
            let c = ch
                .basic_publish(
                    router_exchange,
                    "k".into(),
                    BasicPublishOptions::default(),
                    body,
                    props,
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(c.is_ack());
        }
    };
    let to = |exchange: &str, key: &str, id: &str| {
        BasicProperties::default()
            .with_headers(headers(&[
                ("x-requested-delay", AMQPValue::LongInt(1500)),
                ("x-original-exchange", s(exchange)),
                ("x-original-routing-key", s(key)),
            ]))
            .with_message_id(id.into())
    };
    publish(to(&orders, "eu", "to-orders"), b"1").await;
    publish(to("", &direct, "to-queue"), b"2").await;
    publish(to(&forbidden, "eu", "to-elsewhere"), b"3").await;

    let got = h.receive(&q, 1, Duration::from_secs(15)).await;
    assert_eq!(
        got[0].1.properties.message_id().as_ref().unwrap().as_str(),
        "to-orders"
    );
    h.receive(&direct, 1, Duration::from_secs(15)).await;
    // Parked (read below with `parked list`, as the router's user).
    h.wait_depth(h.names.parked.as_str(), 1).await;

    // Zero-code retry: a consumer rejects once, the router sends it back.
    let mut consumer = Consumer::open(&h.conn, &work, Acks::Manual(10)).await;
    h.ch.basic_publish(
        orders.as_str().into(),
        "work".into(),
        BasicPublishOptions::default(),
        b"job",
        BasicProperties::default().with_message_id("job".into()),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    for attempt in 0..2 {
        let d = consumer.next(Duration::from_secs(15)).await;
        if attempt == 0 {
            d.acker
                .nack(BasicNackOptions {
                    requeue: false,
                    ..Default::default()
                })
                .await
                .unwrap();
        } else {
            assert!(header(&d, "x-delay-router-attempts").is_some());
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
        }
    }
    consumer.close().await;

    // The publisher cannot write into a bucket (nor any queue) directly.
    let sneaky = pub_conn.create_channel().await.unwrap();
    sneaky
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let refused = async {
        sneaky
            .basic_publish(
                "".into(),
                format!("{prefix}.bucket.1s").as_str().into(),
                BasicPublishOptions::default(),
                b"forged",
                BasicProperties::default(),
            )
            .await?
            .await
    }
    .await;
    assert!(refused.is_err(), "a publisher may not write to a bucket");

    // status and parked as the router's user.
    let (ok, out, err) = cli(&["status"], &path);
    assert!(ok && out.contains("running: 1 router(s)"), "{out}{err}");
    let (ok, out, err) = cli(&["parked", "list"], &path);
    assert!(
        ok && out.contains("is not allowed") && out.contains("1 parked message(s) shown"),
        "{out}{err}"
    );
    let (ok, out, err) = cli(&["parked", "replay"], &path);
    assert!(
        ok && out.starts_with("replayed 0, skipped 0 (not matching), failed 1"),
        "{out}{err}"
    );

    // A retired rung is removed by the janitor, as that user (classic; a
    // quorum one is left for the operator).
    run.kill_9();
    // 2s is not on this ladder, not even as a multiple or on the grid
    // (cascade adds 3s-7500ms and 750ms, 375ms); the router declares those.
    let path = write_config(&prefix, &["1500ms"], &extra(&prefix, &router));
    h.track_ladder(&["1500ms"]);
    let mut run = spawn_binary(&path, &log);
    h.wait_retired(&[&format!("{prefix}.bucket.2s")], Duration::from_secs(20))
        .await;
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("ACCESS_REFUSED"), "{logged}");
    assert!(!logged.contains("reconnecting"), "{logged}");
    // Stopped before the cleanup, or it declares again what the cleanup deletes.
    run.kill_9();
    let _ = pub_conn.close(200, "done".into()).await;
    h.cleanup().await;
    std::fs::remove_file(&log).unwrap();
    std::fs::remove_file(&path).unwrap();
}
