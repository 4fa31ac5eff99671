//! Looking a name up: every A and AAAA record, from the system resolver or from one DNS server
//! asked directly over UDP (a minimal client: one question per packet, answers read, no cache).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::net::UdpSocket;

/// Record types asked for.
const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;

/// Why a lookup found nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    /// The resolver did not answer in time.
    #[error("no answer from {resolver} within {timeout:?}")]
    Timeout {
        /// Who was asked ("the system resolver" or an address).
        resolver: String,
        /// The limit.
        timeout: Duration,
    },
    /// The resolver answered with an error code.
    #[error("{resolver} answered {code} for {name}")]
    Refused {
        /// Who was asked.
        resolver: String,
        /// The name.
        name: String,
        /// `NXDOMAIN`, `SERVFAIL`, ...
        code: &'static str,
    },
    /// The name has no A or AAAA record.
    #[error("{name} has no A or AAAA record")]
    NoRecords {
        /// The name.
        name: String,
    },
    /// A socket error or an answer that is not DNS.
    #[error("looking up {name}: {message}")]
    Other {
        /// The name.
        name: String,
        /// What went wrong.
        message: String,
    },
}

/// Every address `host` has: asked of `resolver` over UDP, or of the system resolver when
/// `None`; sorted, without duplicates. An IP literal is its own answer.
pub async fn lookup(
    host: &str,
    resolver: Option<SocketAddr>,
    timeout: Duration,
) -> Result<Vec<IpAddr>, DnsError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let found = match resolver {
        Some(server) => ask(server, host, timeout).await?,
        None => system(host, timeout).await?,
    };
    let mut ips: Vec<IpAddr> = found;
    ips.sort();
    ips.dedup();
    if ips.is_empty() {
        return Err(DnsError::NoRecords {
            name: host.to_string(),
        });
    }
    Ok(ips)
}

async fn system(host: &str, timeout: Duration) -> Result<Vec<IpAddr>, DnsError> {
    let lookup = tokio::net::lookup_host((host, 0));
    match tokio::time::timeout(timeout, lookup).await {
        Err(_) => Err(DnsError::Timeout {
            resolver: "the system resolver".into(),
            timeout,
        }),
        Ok(Err(e)) => Err(DnsError::Other {
            name: host.to_string(),
            message: e.to_string(),
        }),
        Ok(Ok(addrs)) => Ok(addrs.map(|a| a.ip()).collect()),
    }
}

/// Asks `server` for the A and AAAA records of `host`.
async fn ask(server: SocketAddr, host: &str, timeout: Duration) -> Result<Vec<IpAddr>, DnsError> {
    let other = |message: String| DnsError::Other {
        name: host.to_string(),
        message: format!("asking {server}: {message}"),
    };
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local)
        .await
        .map_err(|e| other(e.to_string()))?;
    socket
        .connect(server)
        .await
        .map_err(|e| other(e.to_string()))?;
    let base_id: u16 = rand::random();
    let questions = [(base_id, TYPE_A), (base_id.wrapping_add(1), TYPE_AAAA)];
    for (id, qtype) in questions {
        let query = encode_query(id, host, qtype).map_err(other)?;
        socket
            .send(&query)
            .await
            .map_err(|e| other(e.to_string()))?;
    }
    let answers = async {
        let mut pending: Vec<u16> = questions.iter().map(|(id, _)| *id).collect();
        let mut ips = Vec::new();
        let mut buf = [0u8; 4096];
        while !pending.is_empty() {
            let n = socket
                .recv(&mut buf)
                .await
                .map_err(|e| other(e.to_string()))?;
            let Some(answer) = parse_answer(&buf[..n]) else {
                continue;
            };
            let Some(at) = pending.iter().position(|id| *id == answer.id) else {
                continue;
            };
            pending.swap_remove(at);
            if let Some(code) = answer.error {
                return Err(DnsError::Refused {
                    resolver: server.to_string(),
                    name: host.to_string(),
                    code,
                });
            }
            ips.extend(answer.ips);
        }
        Ok(ips)
    };
    match tokio::time::timeout(timeout, answers).await {
        Ok(result) => result,
        Err(_) => Err(DnsError::Timeout {
            resolver: server.to_string(),
            timeout,
        }),
    }
}

/// A query packet: header, one question, recursion desired.
fn encode_query(id: u16, host: &str, qtype: u16) -> Result<Vec<u8>, String> {
    let mut packet = Vec::with_capacity(32 + host.len());
    packet.extend_from_slice(&id.to_be_bytes());
    packet.extend_from_slice(&0x0100u16.to_be_bytes()); // RD
    packet.extend_from_slice(&1u16.to_be_bytes()); // QDCOUNT
    packet.extend_from_slice(&[0; 6]); // AN, NS, AR counts
    for label in host.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("{host:?} is not a DNS name"));
        }
        packet.push(label.len() as u8);
        packet.extend_from_slice(label.as_bytes());
    }
    packet.push(0);
    packet.extend_from_slice(&qtype.to_be_bytes());
    packet.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(packet)
}

/// What one response said.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    /// The query id it answers.
    id: u16,
    /// The error code, when not NOERROR.
    error: Option<&'static str>,
    /// A and AAAA records in the answer section.
    ips: Vec<IpAddr>,
}

/// Reads a response packet; `None` when it is not a DNS response.
fn parse_answer(packet: &[u8]) -> Option<Answer> {
    let u16_at = |at: usize| -> Option<u16> {
        let bytes = packet.get(at..at + 2)?;
        Some(u16::from_be_bytes([bytes[0], bytes[1]]))
    };
    let id = u16_at(0)?;
    let flags = u16_at(2)?;
    if flags & 0x8000 == 0 {
        return None; // a query, not a response
    }
    let error = match flags & 0x000f {
        0 => None,
        1 => Some("FORMERR"),
        2 => Some("SERVFAIL"),
        3 => Some("NXDOMAIN"),
        5 => Some("REFUSED"),
        _ => Some("an error"),
    };
    let (questions, answers) = (u16_at(4)?, u16_at(6)?);
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(packet, at)? + 4;
    }
    let mut ips = Vec::new();
    for _ in 0..answers {
        at = skip_name(packet, at)?;
        let (rtype, rclass, len) = (u16_at(at)?, u16_at(at + 2)?, usize::from(u16_at(at + 8)?));
        let data = packet.get(at + 10..at + 10 + len)?;
        match (rtype, rclass, data.len()) {
            (TYPE_A, CLASS_IN, 4) => ips.push(IpAddr::from(<[u8; 4]>::try_from(data).ok()?)),
            (TYPE_AAAA, CLASS_IN, 16) => ips.push(IpAddr::from(<[u8; 16]>::try_from(data).ok()?)),
            _ => {} // CNAME and others: the resolver follows them for us
        }
        at += 10 + len;
    }
    Some(Answer { id, error, ips })
}

/// The offset after the name starting at `at` (labels, ending in a zero or a pointer).
fn skip_name(packet: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *packet.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return Some(at + 2),
            l => at += 1 + usize::from(l),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response to `query` with `ips` as answers, the way a server compresses names.
    fn respond(query: &[u8], rcode: u16, ips: &[IpAddr]) -> Vec<u8> {
        let mut packet = query.to_vec();
        packet[2..4].copy_from_slice(&(0x8180 | rcode).to_be_bytes());
        packet[6..8].copy_from_slice(&(ips.len() as u16).to_be_bytes());
        for ip in ips {
            packet.extend_from_slice(&[0xc0, 12]);
            let (rtype, data) = match ip {
                IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
                IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
            };
            packet.extend_from_slice(&rtype.to_be_bytes());
            packet.extend_from_slice(&CLASS_IN.to_be_bytes());
            packet.extend_from_slice(&30u32.to_be_bytes());
            packet.extend_from_slice(&(data.len() as u16).to_be_bytes());
            packet.extend_from_slice(&data);
        }
        packet
    }

    #[test]
    fn answers_are_read_back_from_a_response() {
        let query = encode_query(7, "vllm.ns.svc.cluster.local.", TYPE_A).unwrap();
        assert_eq!(&query[12..17], b"\x04vllm");
        let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        let answer = parse_answer(&respond(&query, 0, &ips)).unwrap();
        assert_eq!(
            answer,
            Answer {
                id: 7,
                error: None,
                ips
            }
        );
        let nx = parse_answer(&respond(&query, 3, &[])).unwrap();
        assert_eq!(nx.error, Some("NXDOMAIN"));
        assert!(parse_answer(&query).is_none(), "a query is no answer");
        assert!(parse_answer(&query[..5]).is_none());
        assert!(encode_query(1, "a..b", TYPE_A).is_err());
    }

    #[tokio::test]
    async fn an_ip_literal_needs_no_lookup() {
        let ips = lookup("10.1.2.3", None, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(ips, ["10.1.2.3".parse::<IpAddr>().unwrap()]);
    }
}
