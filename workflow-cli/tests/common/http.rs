//! The dashboard over raw HTTP for the tests: `workflow web` started as a child process
//! (killed when the test ends), and requests sent on a socket of their own with every wait
//! bounded by [`WAIT`].

use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

use super::{binary, WAIT};

pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    style-src-attr 'unsafe-inline'; img-src 'self'; connect-src 'self'; form-action 'self'; \
    frame-ancestors 'none'; base-uri 'none'";

/// Kills and reaps the dashboard when the test ends, however it ends.
pub struct Dashboard {
    child: Child,
    pub addr: SocketAddr,
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `workflow <store..> web <args..>` with `env`; returns it once it printed its address.
pub fn dashboard(store: &[String], args: &[&str], env: &[(&str, &str)]) -> Dashboard {
    let mut child = Command::new(binary())
        .args(store)
        .arg("web")
        .args(args)
        .env_remove("WORKFLOW_WEB_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start `workflow web`");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let mut started = Dashboard {
        child,
        addr: ([127, 0, 0, 1], 0).into(),
    };
    let line = rx
        .recv_timeout(WAIT)
        .expect("`workflow web` printed no address in time");
    let bound: SocketAddr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .and_then(|a| a.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    // Bound to every interface or to loopback, it is reached on 127.0.0.1.
    started.addr = ([127, 0, 0, 1], bound.port()).into();
    started
}

/// An answer: status, headers (names in lower case) and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn assert_secure(&self) {
        assert_eq!(
            self.header("content-security-policy"),
            Some(CSP),
            "{self:?}"
        );
        assert_eq!(self.header("x-frame-options"), Some("DENY"), "{self:?}");
        assert_eq!(
            self.header("x-content-type-options"),
            Some("nosniff"),
            "{self:?}"
        );
    }
}

/// Sends `head` (request line and headers, without the blank line) and `body` as HTTP/1.1 with
/// `Connection: close`; reads the whole answer.
pub fn send(addr: SocketAddr, head: &str, body: &str) -> Answer {
    let mut s = TcpStream::connect_timeout(&addr, WAIT).expect("cannot connect to the dashboard");
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.set_write_timeout(Some(WAIT)).unwrap();
    let mut req = format!("{head}\r\nConnection: close\r\n");
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("no complete answer in time");
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {raw}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

pub fn get(addr: SocketAddr, path: &str, host: &str) -> Answer {
    send(addr, &format!("GET {path} HTTP/1.1\r\nHost: {host}"), "")
}
