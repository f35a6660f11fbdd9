//! How busy the machine was while `rafter bench` timed its calls, for the figures' context.
//!
//! Why: on a virtual machine whose cores the hypervisor shares with other guests, a CPU
//! kernel split over every core waits for the slowest of them, and a core the hypervisor
//! takes away ("steal" time) stalls the whole kernel. On the H200 machine's 16-core host
//! 3-14% of the CPU time was stolen while rafter's 16 threads ran (vmstat, 2026-12-01), and
//! the same model's calls moved by up to 60% between runs minutes apart. A timing printed
//! with the steal and the other processes' load beside it says which figures to trust.
//!
//! Linux only (`/proc/stat`, `/proc/self/stat`, both counted in the same clock ticks);
//! elsewhere nothing is reported.

/// Cumulative CPU time of the whole machine and of this process, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every tick of every CPU: busy, idle, waiting or stolen.
    pub total: u64,
    /// Ticks the CPUs ran something (user, nice, system, interrupts).
    pub busy: u64,
    /// Ticks the hypervisor ran other guests while a CPU of this one wanted to run.
    pub steal: u64,
    /// Ticks this process ran (user and system).
    pub own: u64,
    /// CPUs the machine's counters sum over (`/proc/stat`'s `cpuN` lines: in a container
    /// limited to fewer CPUs, the host's, which is what the ticks are shares of).
    pub cpus: usize,
}

/// The machine's load over an interval, from two [`CpuTimes`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostLoad {
    /// Stolen ticks over all ticks of the interval.
    pub steal_fraction: f64,
    /// CPUs' worth of time other processes ran (busy ticks not this process's).
    pub other_cores: f64,
}

impl CpuTimes {
    /// The current counters, or `None` where `/proc` is unavailable.
    pub fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let (total, busy, steal) = parse_machine(&stat)?;
        Some(CpuTimes {
            total,
            busy,
            steal,
            own: parse_own(&own)?,
            cpus: count_cpus(&stat),
        })
    }

    /// The load between `self` (earlier) and `later`; `None` when no tick passed (an
    /// interval shorter than a tick).
    pub fn load_until(&self, later: &CpuTimes) -> Option<HostLoad> {
        let total = later.total.checked_sub(self.total)?;
        if total == 0 {
            return None;
        }
        let busy = later.busy.saturating_sub(self.busy);
        let steal = later.steal.saturating_sub(self.steal);
        let own = later.own.saturating_sub(self.own);
        Some(HostLoad {
            steal_fraction: steal as f64 / total as f64,
            other_cores: busy.saturating_sub(own) as f64 / total as f64 * later.cpus as f64,
        })
    }
}

impl HostLoad {
    /// The line printed after `during` (`timing`, `calibrating cpu`).
    pub fn line(&self, during: &str) -> String {
        format!(
            "host: while {during}, {:.1}% of the CPU time stolen by the hypervisor, other \
             processes busy on {:.2} CPUs",
            self.steal_fraction * 100.0,
            self.other_cores
        )
    }
}

/// Prints (to stderr) the machine's load since `from`, where `/proc` has it.
pub fn report_since(from: Option<CpuTimes>, during: &str) {
    if let Some(load) = from
        .zip(CpuTimes::now())
        .and_then(|(a, b)| a.load_until(&b))
    {
        eprintln!("{}", load.line(during));
    }
}

/// `(total, busy, steal)` from the `cpu` line of `/proc/stat`: `user nice system idle
/// iowait irq softirq steal [guest guest_nice]` (guest time is already in `user`).
fn parse_machine(stat: &str) -> Option<(u64, u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    if f.len() < 4 {
        return None;
    }
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    let (user, nice, system, idle, iowait, irq, softirq, steal) =
        (at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
    let busy = user + nice + system + irq + softirq;
    Some((busy + idle + iowait + steal, busy, steal))
}

/// The `cpuN` lines of `/proc/stat` (at least 1).
fn count_cpus(stat: &str) -> usize {
    stat.lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count()
        .max(1)
}

/// User plus system ticks from `/proc/self/stat` (fields 14 and 15; counted after the
/// command name's closing parenthesis, since the name may hold spaces).
fn parse_own(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_line_splits_into_busy_idle_and_stolen() {
        let stat = "cpu  100 5 20 800 10 3 2 60 7 0\ncpu0 50 2 10 400 5 1 1 30 0 0\nintr 1 2\n";
        // busy = 100 + 5 + 20 + 3 + 2; total adds idle 800, iowait 10, steal 60.
        assert_eq!(parse_machine(stat), Some((1000, 130, 60)));
        assert_eq!(count_cpus(stat), 1);
        assert_eq!(
            count_cpus("cpu  1 2 3 4\ncpu0 1\ncpu1 1\ncpu15 1\nintr 1\n"),
            3
        );
        assert_eq!(parse_machine("intr 1 2\n"), None);
        assert_eq!(parse_machine("cpu  1 x 3 4\n"), None);
    }

    #[test]
    fn own_ticks_are_counted_after_the_command_name() {
        // A name with spaces and a parenthesis: fields are counted from the last `)`.
        let stat = "4242 (rafter (x) y) R 1 4242 4242 0 -1 4194304 100 0 0 0 37 5 0 0 20 0 17";
        assert_eq!(parse_own(stat), Some(42));
        assert_eq!(parse_own("4242 rafter"), None);
    }

    #[test]
    fn load_is_steal_over_all_ticks_and_others_busy_in_cpus() {
        let a = CpuTimes {
            total: 1000,
            busy: 100,
            steal: 0,
            own: 50,
            cpus: 16,
        };
        // 1,600 ticks over 16 CPUs: 80 stolen (5%), 1,000 busy of which 600 ours.
        let b = CpuTimes {
            total: 2600,
            busy: 1100,
            steal: 80,
            own: 650,
            cpus: 16,
        };
        let l = a.load_until(&b).unwrap();
        assert!((l.steal_fraction - 0.05).abs() < 1e-12);
        assert!((l.other_cores - 4.0).abs() < 1e-12, "{l:?}");
        assert_eq!(a.load_until(&a), None);
        assert!(l
            .line("timing")
            .contains("while timing, 5.0% of the CPU time stolen"));
    }

    #[test]
    fn this_machines_counters_read_where_proc_exists() {
        if std::path::Path::new("/proc/stat").exists() {
            let t = CpuTimes::now().expect("/proc/stat and /proc/self/stat parse");
            assert!(t.total >= t.busy && t.total >= t.steal && t.cpus >= 1);
        }
    }
}
