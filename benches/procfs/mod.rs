//! What a bench reads about a process from /proc: CPU time and peak RSS,
//! and which process is the broker's.

/// utime + stime of `pid` (every thread), in microseconds; peak RSS in KiB.
pub fn cpu_and_rss(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (ticks * 10_000, hwm) // 100 ticks per second on Linux
}

/// stime of `pid` (every thread), in microseconds: its CPU in the kernel.
#[allow(dead_code)] // not every bench that shares this module reads it
pub fn system_cpu(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ticks: u64 = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .nth(12)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ticks * 10_000
}

/// Context switches of every live thread of `pid` (voluntary and not), from
/// `/proc/<pid>/task/*/status`: each wake-up of a sleeping thread is one.
#[allow(dead_code)] // not every bench that shares this module reads it
pub fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .map(|task| {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            status
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                })
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// The broker's beam.smp: BENCH_BROKER_PID, else what `rabbitmqctl eval
/// 'os:getpid().'` answers (BENCH_CTL names another rabbitmqctl).
#[allow(dead_code)] // not every bench that shares this module reads it
pub fn broker_pid() -> u32 {
    if let Some(pid) = std::env::var("BENCH_BROKER_PID")
        .ok()
        .and_then(|p| p.parse().ok())
    {
        return pid;
    }
    let ctl = std::env::var("BENCH_CTL").unwrap_or_else(|_| "rabbitmqctl".into());
    let mut parts = ctl.split_whitespace();
    let out = std::process::Command::new(parts.next().expect("BENCH_CTL"))
        .args(parts)
        .args(["eval", "os:getpid()."])
        .output()
        .expect("rabbitmqctl (set BENCH_BROKER_PID)");
    assert!(
        out.status.success(),
        "rabbitmqctl eval os:getpid(): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_matches('"')
        .parse()
        .expect("a pid")
}
