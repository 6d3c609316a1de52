// Private HDF5 helpers of the io module: H5_CHECK turns a negative herr_t/hid_t/htri_t into an
// OutputError carrying the call, the file, the object and HDF5's own error stack (which is never
// printed to stderr), and Handle closes identifiers on every path out of a function.
#pragma once

#include <hdf5.h>

#include <string>
#include <string_view>
#include <utility>

namespace trainscope::io::detail {

// Turns off HDF5's automatic printing of its error stack; errors are reported by exceptions.
void silence_hdf5_error_printing();

// Throws core::OutputError: "HDF5 <function> failed on '<file>' (<object>): <innermost errors>".
[[noreturn]] void throw_h5_error(std::string_view call, std::string_view file,
                                 std::string_view object);

template <class T>
T h5_check(T value, std::string_view call, std::string_view file, std::string_view object) {
    if (value < 0) throw_h5_error(call, file, object);
    return value;
}

// Owns one HDF5 identifier and closes it with the matching H5?close. Closing datasets, groups,
// dataspaces, types, attributes and property lists is local (not collective), so this is safe on
// error paths; the file itself is closed explicitly (H5Fclose is collective).
class Handle {
  public:
    using Closer = herr_t (*)(hid_t);
    Handle() = default;
    Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
    Handle(Handle&& other) noexcept
        : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}
    Handle& operator=(Handle&& other) noexcept {
        if (this != &other) {
            reset();
            id_ = std::exchange(other.id_, H5I_INVALID_HID);
            closer_ = other.closer_;
        }
        return *this;
    }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() { reset(); }

    hid_t get() const { return id_; }
    operator hid_t() const { return id_; }
    void reset() {
        if (id_ >= 0 && closer_) closer_(id_); // nothing useful to do with a failed close here
        id_ = H5I_INVALID_HID;
    }
    // Forgets the identifier without closing it (used when a rank must avoid any HDF5 call).
    void release() { id_ = H5I_INVALID_HID; }

  private:
    hid_t id_ = H5I_INVALID_HID;
    Closer closer_ = nullptr;
};

} // namespace trainscope::io::detail

// H5_CHECK(call, file, object): evaluates the HDF5 call once, returns its value, throws on < 0.
#define H5_CHECK(call, file, object)                                                               \
    ::trainscope::io::detail::h5_check((call), #call, (file), (object))
