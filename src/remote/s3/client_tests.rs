//! The client against small servers on loopback that answer as a broken or hostile endpoint
//! could: endless bodies, bodies larger than listed, a byte at a time, never an answer; and a
//! local file that cannot be written. Each server takes a few connections and stops by itself.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{Client, Limits};
use super::credentials::Config;

/// A server on loopback: each connection's request is read, counted, then `answer` writes
/// what it likes. At most 8 connections; each answer stops after 20 s.
fn server(answer: fn(&mut TcpStream)) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(8) {
            let Ok(mut s) = stream else { continue };
            let seen = seen.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).is_ok_and(|n| n == 1) {
                    head.push(b[0]);
                }
                seen.fetch_add(1, Ordering::SeqCst);
                answer(&mut s);
            });
        }
    });
    (addr, count)
}

fn client(endpoint: &str, limits: Limits) -> Client {
    let cfg = Config {
        endpoint: Some(endpoint.to_string()),
        region: "us-east-1".into(),
        credentials: None,
        described: "a test server".into(),
    };
    Client::with_limits(cfg, "bucket", limits).unwrap()
}

fn quick() -> Limits {
    Limits {
        connect: Duration::from_secs(2),
        answer: Duration::from_millis(500),
        stall: Duration::from_secs(2),
        grace: Duration::from_secs(1),
        min_rate: 1000,
        tries: 3,
    }
}

/// Write for at most 20 s (the client hangs up long before).
fn endless(s: &mut TcpStream, head: &str) {
    if s.write_all(head.as_bytes()).is_err() {
        return;
    }
    let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) && s.write_all(chunk.as_bytes()).is_ok() {}
}

#[test]
fn an_endless_body_is_cut_at_the_cap_and_not_retried() {
    let (url, seen) = server(|s| {
        endless(
            s,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        )
    });
    let c = client(&url, quick());
    let start = Instant::now();
    let e = c.get("manifest.json", 1 << 20).err().unwrap().to_string();
    assert!(e.contains("past the 1048576 bytes"), "{e}");
    assert!(e.contains("s3://bucket/manifest.json"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "a refused answer is not asked again"
    );
    // Into a file: the file never grows past the listed size.
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("chunk");
    let e = c.get_to_file("c/0/0/0", &f, 5000).unwrap_err().to_string();
    assert!(e.contains("past the 5000 bytes"), "{e}");
    assert!(std::fs::metadata(&f).map_or(0, |m| m.len()) <= 5000);
}

#[test]
fn a_body_other_than_listed_is_refused_before_it_is_read() {
    let (url, _) = server(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\nabc");
    });
    let c = client(&url, quick());
    let e = c.get("manifest.json", 1 << 20).err().unwrap().to_string();
    assert!(e.contains("1000000000000 bytes, more than"), "{e}");
    let t = tempfile::tempdir().unwrap();
    let e = c
        .get_to_file("c/0/0/0", &t.path().join("chunk"), 100)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("says 1000000000000 bytes, the listing 100"),
        "{e}"
    );
}

#[test]
fn a_server_that_drips_fails_the_request_within_its_limits() {
    let (url, seen) = server(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) && s.write_all(b"x").is_ok() {
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let c = client(&url, quick());
    let start = Instant::now();
    let e = c.get("manifest.json", 1 << 20).err().unwrap().to_string();
    assert!(e.contains("slower than"), "{e}");
    assert!(e.contains("after 3 tries"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(12),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(seen.load(Ordering::SeqCst), 3);
}

#[test]
fn a_server_that_never_answers_fails_after_the_documented_tries() {
    let (url, seen) = server(|_| std::thread::sleep(Duration::from_secs(20)));
    let c = client(&url, quick());
    let start = Instant::now();
    let e = c.head("x").unwrap_err().to_string();
    assert!(
        e.contains("no answer") && e.contains("after 3 tries"),
        "{e}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(seen.load(Ordering::SeqCst), 3);
}

#[test]
fn a_local_write_that_fails_names_the_file_and_is_not_retried() {
    let (url, seen) = server(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc");
    });
    let c = client(&url, quick());
    let t = tempfile::tempdir().unwrap();
    // A folder that is a file: no file can be created under it, whoever runs the test.
    let blocker = t.path().join("not-a-folder");
    std::fs::write(&blocker, b"").unwrap();
    let target = blocker.join("chunk");
    let e = c.get_to_file("c/0/0/0", &target, 3).unwrap_err();
    assert!(matches!(e, crate::error::Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains(&target.display().to_string()), "{e}");
    assert!(!e.to_string().contains("no answer"), "{e}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}
