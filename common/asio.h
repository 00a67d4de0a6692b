// The one way to include Boost.Asio in cpprun.
//
// Boost 1.74's Asio uses std::exchange without including <utility>, which breaks under C++20
// with g++ 12, so <utility> comes first. Include this only from .cc files of rendezvous/ and the
// agent's event loop; headers forward-declare boost::asio::io_context instead.
#pragma once

// clang-format off
#include <utility>  // must come first, see above
#include <boost/asio.hpp>
// clang-format on
