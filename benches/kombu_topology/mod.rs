//! kombu's native delayed delivery as the benches drive it (the NServiceBus
//! design: 28 levels of TTL queues and exchanges, the delay in whole seconds
//! as binary digits in the routing key): kombu installed from PyPI into a
//! virtualenv, its topology declared and its routing keys computed by
//! kombu's own code (`benches/kombu/driver.py`), and the publish that sends
//! a message into it. Every subprocess runs under a time limit.

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, PublisherConfirm};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KOMBU: &str = "kombu>=5.5,<6";
const DRIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/kombu/driver.py");
/// Creating the virtualenv and installing kombu from PyPI.
const INSTALL_LIMIT: Duration = Duration::from_secs(600);
/// One call of the driver: declaring or deleting the 28 levels.
const DRIVER_LIMIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(50);

/// Runs `cmd` with `stdin` as its input; its stdout, or why not (it failed,
/// or had not ended within `limit`: then it is killed).
pub fn run(cmd: &mut Command, stdin: &[u8], limit: Duration) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let mut input = child.stdin.take().expect("piped stdin");
    let bytes = stdin.to_vec();
    // Dropped once written: the child sees the end of its input.
    let writer = std::thread::spawn(move || input.write_all(&bytes));
    let stdout = read_all(child.stdout.take().expect("piped stdout"));
    let stderr = read_all(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("{cmd:?}: {e}"))? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{cmd:?}: not done within {limit:?}, killed"));
        }
        std::thread::sleep(POLL);
    };
    let _ = writer.join();
    let stdout = stdout.join().unwrap_or_default();
    if !status.success() {
        let stderr = stderr.join().unwrap_or_default();
        return Err(format!("{cmd:?}: {status}\n{stderr}"));
    }
    Ok(stdout)
}

/// Reads `pipe` to its end on a thread of its own (a child blocked on a full
/// pipe would never end).
fn read_all(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// The virtualenv's python, with kombu installed (from PyPI, on first use):
/// BENCH_VENV, default `target/tmp/kombu-venv`.
pub fn python() -> PathBuf {
    let venv = std::env::var_os("BENCH_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("kombu-venv"));
    let python = venv.join("bin/python");
    let has_kombu = |p: &Path| {
        Command::new(p)
            .args(["-c", "import kombu.transport.native_delayed_delivery"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if has_kombu(&python) {
        return python;
    }
    let make_venv = || {
        run(
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
            b"",
            INSTALL_LIMIT,
        )
    };
    if make_venv().is_err() {
        // Debian splits venv out of python3.
        println!("python3 -m venv failed: installing python3-venv with apt-get");
        run(
            Command::new("apt-get").args(["install", "-y", "-q", "python3-venv"]),
            b"",
            INSTALL_LIMIT,
        )
        .expect("apt-get install python3-venv");
        make_venv().expect("python3 -m venv");
    }
    run(
        Command::new(venv.join("bin/pip")).args(["install", "-q", KOMBU]),
        b"",
        INSTALL_LIMIT,
    )
    .expect("pip install kombu");
    assert!(has_kombu(&python), "kombu installed but not importable");
    python
}

/// kombu's topology under one prefix, as kombu declared it.
pub struct Topology {
    pub prefix: String,
    /// kombu's version.
    pub kombu: String,
    /// The exchange every delayed message is published to (the top level).
    pub exchange: String,
    /// The destination queue (`<prefix>_dest`), bound with routing key `dest`.
    pub queue: String,
    /// kombu's routing key for each countdown passed to [`Topology::declare`].
    pub routing_keys: Vec<String>,
}

impl Topology {
    /// Asks kombu to declare its topology under `prefix` with `queue_type`
    /// (classic, quorum) queues, and a destination queue, and to compute the
    /// routing key of each of `countdowns` (whole seconds).
    pub fn declare(
        python: &Path,
        url: &str,
        prefix: &str,
        queue_type: &str,
        countdowns: &[u64],
    ) -> Self {
        let input = serde_json::to_vec(countdowns).expect("countdowns as JSON");
        let out = run(
            Command::new(python)
                .arg(DRIVER)
                .args(["declare", url, prefix, queue_type]),
            &input,
            DRIVER_LIMIT,
        )
        .expect("kombu's declare");
        let plan: serde_json::Value = serde_json::from_str(&out).expect("driver.py's plan");
        let text = |key: &str| plan[key].as_str().expect(key).to_owned();
        let routing_keys: Vec<String> = plan["routing_keys"]
            .as_array()
            .expect("routing_keys")
            .iter()
            .map(|k| k.as_str().expect("a routing key").to_owned())
            .collect();
        assert_eq!(routing_keys.len(), countdowns.len(), "a key per countdown");
        Self {
            prefix: prefix.to_owned(),
            kombu: text("kombu"),
            exchange: text("exchange"),
            queue: text("queue"),
            routing_keys,
        }
    }

    /// Publishes a message with the `k`th countdown given to
    /// [`Topology::declare`]; the broker's confirm to come.
    pub async fn publish(
        &self,
        ch: &Channel,
        k: usize,
        body: &[u8],
        props: BasicProperties,
    ) -> lapin::Result<PublisherConfirm> {
        ch.basic_publish(
            self.exchange.as_str().into(),
            self.routing_keys[k].as_str().into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await
    }

    /// Deletes every queue and exchange of the prefix (failures ignored:
    /// what is gone is gone).
    pub fn delete(&self, python: &Path, url: &str) {
        if let Err(e) = run(
            Command::new(python)
                .arg(DRIVER)
                .args(["delete", url, &self.prefix]),
            b"",
            DRIVER_LIMIT,
        ) {
            println!("kombu's topology not removed: {e}");
        }
    }
}
