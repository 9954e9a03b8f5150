//! UDP receive and reply that know each datagram's real destination address
//! (`IP_PKTINFO` / `IPV6_RECVPKTINFO`), so a wildcard-bound socket reports and
//! answers from the address the client actually targeted.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use nix::libc::{in_addr, in_pktinfo, in6_addr, in6_pktinfo};
use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, sendmsg, setsockopt, sockopt,
};

/// A received datagram's addressing.
pub(crate) struct Datagram {
    /// Destination address and port of the datagram.
    pub local: SocketAddr,
    /// Sender.
    pub peer: SocketAddr,
}

/// Enables destination-address reporting on `socket`.
pub(crate) fn enable(socket: &UdpSocket) -> io::Result<()> {
    match socket.local_addr()? {
        SocketAddr::V4(_) => setsockopt(socket, sockopt::Ipv4PacketInfo, &true)?,
        SocketAddr::V6(_) => setsockopt(socket, sockopt::Ipv6RecvPacketInfo, &true)?,
    }
    Ok(())
}

/// Receives one datagram into `buf` (payload is not needed by callers) (honours the socket's read timeout).
pub(crate) fn recv(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Datagram> {
    let bound = socket.local_addr()?;
    let mut iov = [IoSliceMut::new(buf)];
    let mut control = nix::cmsg_space!(in6_pktinfo);
    let msg = recvmsg::<SockaddrStorage>(socket.as_raw_fd(), &mut iov, Some(&mut control), MsgFlags::empty())?;
    let destination = msg.cmsgs()?.find_map(|cmsg| match cmsg {
        ControlMessageOwned::Ipv4PacketInfo(info) => {
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr))))
        }
        ControlMessageOwned::Ipv6PacketInfo(info) => Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr))),
        _ => None,
    });
    let peer = msg
        .address
        .as_ref()
        .and_then(std_addr)
        .ok_or_else(|| io::Error::other("datagram without an IP sender address"))?;
    Ok(Datagram { local: SocketAddr::new(destination.unwrap_or(bound.ip()), bound.port()), peer })
}

/// Sends `data` to the sender of `datagram`, from the address it was sent to.
pub(crate) fn reply(socket: &UdpSocket, datagram: &Datagram, data: &[u8]) -> io::Result<()> {
    let iov = [IoSlice::new(data)];
    let peer = SockaddrStorage::from(datagram.peer);
    let fd = socket.as_raw_fd();
    let flags = MsgFlags::empty();
    match datagram.local.ip() {
        IpAddr::V4(source) => {
            let info = in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: in_addr { s_addr: u32::from(source).to_be() },
                ipi_addr: in_addr { s_addr: 0 },
            };
            sendmsg(fd, &iov, &[ControlMessage::Ipv4PacketInfo(&info)], flags, Some(&peer))?
        }
        IpAddr::V6(source) => {
            let info = in6_pktinfo { ipi6_addr: in6_addr { s6_addr: source.octets() }, ipi6_ifindex: 0 };
            sendmsg(fd, &iov, &[ControlMessage::Ipv6PacketInfo(&info)], flags, Some(&peer))?
        }
    };
    Ok(())
}

/// Converts a socket address from the kernel into a std one (IP families only).
fn std_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    addr.as_sockaddr_in().map(|&v4| v4.into()).or_else(|| addr.as_sockaddr_in6().map(|&v6| v6.into()))
}
