//! Host timeline semaphore semantics.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rafter_hal::{Semaphore, SemaphoreError};

const LONG: Duration = Duration::from_secs(10);

#[test]
fn signal_must_advance_the_timeline() {
    let s = Semaphore::host(3);
    assert_eq!(s.value(), 3);
    assert_eq!(
        s.signal(2),
        Err(SemaphoreError::NotMonotonic {
            current: 3,
            requested: 2
        })
    );
    assert_eq!(
        s.signal(3),
        Err(SemaphoreError::NotMonotonic {
            current: 3,
            requested: 3
        })
    );
    assert_eq!(s.value(), 3);
    s.signal(7).unwrap();
    assert_eq!(s.value(), 7);
    assert_eq!(s.query(), Ok(7));
}

#[test]
fn wait_for_a_reached_value_returns_at_once() {
    let s = Semaphore::host(5);
    s.wait(0, Duration::ZERO).unwrap();
    s.wait(5, Duration::ZERO).unwrap();
}

#[test]
fn wait_times_out_with_the_values_in_the_error() {
    let s = Semaphore::host(1);
    match s.wait(2, Duration::from_millis(20)) {
        Err(SemaphoreError::Timeout {
            value: 2,
            current: 1,
            waited,
        }) => assert!(waited >= Duration::from_millis(20)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let message = s.wait(2, Duration::ZERO).unwrap_err().to_string();
    assert!(
        message.contains("waiting for semaphore value 2 (current value 1)"),
        "{message}"
    );
}

#[test]
fn a_signal_from_another_thread_releases_every_lower_waiter() {
    let s = Semaphore::host(0);
    let waiters: Vec<_> = (1..=3)
        .map(|v| {
            let s = s.clone();
            thread::spawn(move || s.wait(v, LONG))
        })
        .collect();
    s.signal(3).unwrap();
    for waiter in waiters {
        waiter.join().unwrap().unwrap();
    }
}

#[test]
fn failure_reaches_current_and_future_waiters_and_the_first_reason_wins() {
    let s = Semaphore::host(0);
    let (started_tx, started_rx) = mpsc::channel();
    let waiter = {
        let s = s.clone();
        thread::spawn(move || {
            started_tx.send(()).unwrap();
            s.wait(1, LONG)
        })
    };
    started_rx.recv().unwrap();
    s.fail("kernel 'matmul' failed: NaN");
    s.fail("a later reason");
    assert_eq!(
        waiter.join().unwrap(),
        Err(SemaphoreError::Failed("kernel 'matmul' failed: NaN".into()))
    );
    // Future waiters, even for values already reached, see the failure.
    assert_eq!(
        s.wait(0, Duration::ZERO),
        Err(SemaphoreError::Failed("kernel 'matmul' failed: NaN".into()))
    );
    assert_eq!(s.failure().as_deref(), Some("kernel 'matmul' failed: NaN"));
    assert!(matches!(s.signal(1), Err(SemaphoreError::Failed(_))));
    assert!(s.query().is_err());
    assert_eq!(s.value(), 0);
}

#[test]
fn timepoints_fire_once_on_reach_or_failure_even_if_already_reached() {
    let s = Semaphore::host(2);
    let (tx, rx) = mpsc::channel();
    let callback = |tag: &'static str| {
        let tx = tx.clone();
        Box::new(move |r: Result<(), SemaphoreError>| tx.send((tag, r)).unwrap())
    };
    s.notify_at(1, callback("reached-before"));
    assert_eq!(rx.try_recv().unwrap(), ("reached-before", Ok(())));
    s.notify_at(4, callback("at-4"));
    s.notify_at(9, callback("at-9"));
    assert!(rx.try_recv().is_err());
    s.signal(5).unwrap();
    assert_eq!(rx.try_recv().unwrap(), ("at-4", Ok(())));
    assert!(rx.try_recv().is_err());
    s.fail("lost");
    assert_eq!(
        rx.try_recv().unwrap(),
        ("at-9", Err(SemaphoreError::Failed("lost".into())))
    );
    s.notify_at(1, callback("after-failure"));
    assert_eq!(
        rx.try_recv().unwrap(),
        ("after-failure", Err(SemaphoreError::Failed("lost".into())))
    );
    assert!(rx.try_recv().is_err());
}

#[test]
fn wait_all_waits_for_every_pair() {
    let a = Semaphore::host(0);
    let b = Semaphore::host(0);
    let pairs = vec![(a.clone(), 1), (b.clone(), 2)];
    let waiter = thread::spawn(move || Semaphore::wait_all(&pairs, LONG));
    a.signal(1).unwrap();
    b.signal(2).unwrap();
    waiter.join().unwrap().unwrap();
    assert!(matches!(
        Semaphore::wait_all(&[(a, 1), (b, 3)], Duration::from_millis(1)),
        Err(SemaphoreError::Timeout { value: 3, .. })
    ));
}

#[test]
fn handles_share_one_timeline() {
    let s = Semaphore::host(0);
    let t = s.clone();
    assert!(s.same_semaphore(&t));
    assert!(!s.same_semaphore(&Semaphore::host(0)));
    t.signal(4).unwrap();
    assert_eq!(s.value(), 4);
    assert!(s.downcast_ref::<rafter_hal::HostSemaphore>().is_some());
    let _: Arc<dyn rafter_hal::SemaphoreImpl> = Arc::new(rafter_hal::HostSemaphore::new(0));
}
